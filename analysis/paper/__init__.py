"""The λ-GELU paper's Section IV, regenerated from run directories (`pipeline report`).

- Table I: per benchmark and activation (GELU, ReLU, λ-GELU per s-init mode), the best validation
  score (BVS, mean ± std over seeds), the epoch it was reached, the network-mean λ at the last
  epoch and the drift V_λ, from runs where λ is learned all along (no annealing).
- Table II: the metric of the selected checkpoint before and after the ReLU swap, on the validation split
  (used for selection) and on the test split (held out), mean ± 95% t-interval over seeds, for: the GELU
  baseline swapped directly, annealed λ-GELU (Algorithm 1), a ReLU network trained from scratch (no swap),
  and two ablations: annealing with λ not learned (gate.lr_mult = 0) and GELU swapped to ReLU at e_s then
  fine-tuned as ReLU for the remaining epochs (harden.method = swap). Paired comparisons (same seeds) of the
  shipped networks' test metric, and a plain statement of what the intervals support.
- Figure 1 (and 2): over a (t, c) grid, colour = Δλ(t, c), the cell mean of V_λ over seeds and
  init modes; annotation = ΔBVS(t, c) = mean BVS of λ-GELU − mean BVS of GELU.
- Figure 3: validation curves (mean ± std over seeds) and the Spearman correlation ρ_S(e) of the
  layerwise λ profiles between init modes, averaged over seeds.
- The side-by-side with the paper's own numbers (PAPER_TABLE1, PAPER_TABLE2 below).

A run contributes one record per variant (`runs.py`); everything is computed from `config.json`,
`manifest.json` (each variant's record, the selected checkpoint's hardness), `train/metrics.csv` and
`swap/swap.json`, so it works on runs from any machine, and on the run directories of several sweep shards
together. The package: `runs` (reading runs), `reference` (the paper's numbers), `tables`, `figures`, `report`.
"""

from __future__ import annotations

from .figures import plot_figure3, plot_table, plot_tc_heatmap
from .runs import LABELS, MODES, Collection, Record, collect, read_run, run_dirs
from .reference import PAPER_ROW, PAPER_TABLE1, PAPER_TABLE2, PAPER_TC, paper_row
from .report import write_report
from .tables import (ACT_LABELS, COMPARISON_HEADER, COMPARISONS, ROW_KINDS, TABLE1_HEADER, TABLE2_HEADER, comparison_cells,
                     comparisons, pm, side_by_side, spearman_curves, support_lines, table1, table1_cells, table2,
                     table2_cells, tc_grid)

__all__ = ["ACT_LABELS", "COMPARISONS", "COMPARISON_HEADER", "Collection", "LABELS", "MODES", "PAPER_ROW", "PAPER_TABLE1",
           "PAPER_TABLE2", "PAPER_TC", "ROW_KINDS", "Record", "TABLE1_HEADER", "TABLE2_HEADER", "collect", "comparison_cells",
           "comparisons", "paper_row", "plot_figure3", "plot_table", "plot_tc_heatmap", "pm", "read_run", "run_dirs",
           "side_by_side", "spearman_curves", "support_lines", "table1", "table1_cells", "table2", "table2_cells", "tc_grid",
           "write_report"]
