"""The verify stage's library (the stage: `pipeline/stages/verify.py`): `properties` builds the L∞ robustness
properties of a run's three networks (the swapped ReLU network, its int8 model, the smooth network) as tasks of the
engine's property loop, and decides which rows are an int8 model's; `chain` says what the answers mean together. The
engine that decides the properties is `analysis/verification/`. Beside them, per network: `radius` (each sample's
certified radius by bisection over the engine's answers, certified accuracy as a curve of ε) and `unstable` (the ReLUs
left unstable by one CROWN pass at ε, and per layer the share whose sign is fixed over the box).
"""
