"""Algorithm 1 inside Hugging Face's `Trainer.train()`: no loop of your own.

    from pipeline import to_gates
    from pipeline.hf import HardeningCallback, hardening_optimizer

    model, report = to_gates(model, example=batch["input_ids"][:2])      # BERT, GPT-2, ViT ... as transformers builds them
    args = TrainingArguments("out", num_train_epochs=10, learning_rate=5e-5, weight_decay=0.01)
    hardener = Hardener(model, epochs=int(args.num_train_epochs), example=batch["input_ids"][:2])
    trainer = Trainer(model=model, args=args, train_dataset=train, optimizers=(hardening_optimizer(hardener, args), None),
                      callbacks=[HardeningCallback(hardener)])
    trainer.train()

The Trainer builds its own optimizer with its own parameter groups, which would give every hardness parameter s weight
decay and the weights' learning rate: `hardening_optimizer` gives it the hardener's groups (s at c·lr, no decay), and
the Trainer's LR scheduler then scales every group, keeping the ratio. The callback sets every gate's λ at the start of
each epoch (or each step, `per_step=True`), refuses a run whose epoch count is not the hardener's T (λ reaches
λ_target at epoch T), and saves the hardener's state beside each checkpoint the Trainer writes (`hardener.pt`); to
resume, `HardeningCallback.load(hardener, "out/checkpoint-N")` before `trainer.train(resume_from_checkpoint=...)`.

Importing this module imports transformers (the `models` extra, `pipeline.extras`).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from .extras import import_transformers
from .hardener import HardenError, Hardener

_transformers = import_transformers()

STATE_FILE = "hardener.pt"  # in each checkpoint-<step>/ folder the Trainer writes


def hardening_optimizer(hardener: Hardener, args: Any) -> torch.optim.Optimizer:
    """AdamW (the Trainer's default) over the hardener's parameter groups at the run's learning rate and weight decay."""
    return torch.optim.AdamW(hardener.param_groups(lr=args.learning_rate, weight_decay=args.weight_decay),
                             lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)


class HardeningCallback(_transformers.TrainerCallback):
    """Calls the hardener's `start_epoch` (or `start_step`) as the Trainer goes; saves its state with each checkpoint."""

    def __init__(self, hardener: Hardener, per_step: bool = False):
        self.hardener, self.per_step = hardener, per_step
        self.steps_per_epoch = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if args.max_steps > 0 or float(args.num_train_epochs) != self.hardener.epochs:
            runs = f"max_steps={args.max_steps}" if args.max_steps > 0 else f"{args.num_train_epochs} epochs"
            raise HardenError(f"HardeningCallback: the Trainer runs {runs}, the hardener T = {self.hardener.epochs} epochs: "
                              f"set TrainingArguments(num_train_epochs={self.hardener.epochs}) and no max_steps, so that λ "
                              "reaches λ_target at the last epoch")
        self.steps_per_epoch = max(1, math.ceil(state.max_steps / self.hardener.epochs))

    def on_epoch_begin(self, args, state, control, **kwargs):
        # state.epoch is a float, the epochs done so far (0.0 at the start); the hardener counts 1..T
        self.hardener.start_epoch(int(round(state.epoch or 0.0)) + 1)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.per_step:
            n = self.steps_per_epoch
            self.hardener.start_step(state.global_step // n + 1, state.global_step % n, n)

    def on_save(self, args, state, control, **kwargs):  # after the Trainer wrote checkpoint-<step>/
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(folder):
            torch.save(self.hardener.state_dict(), os.path.join(folder, STATE_FILE))

    @staticmethod
    def load(hardener: Hardener, checkpoint: str) -> None:
        """Restore the hardener's state saved with a Trainer checkpoint folder (before resuming from it)."""
        hardener.load_state_dict(torch.load(os.path.join(checkpoint, STATE_FILE), weights_only=False))
