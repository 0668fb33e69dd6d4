"""Training: the loop (trainer.py), a run in its folder (run.py), and what makes runs exact and safe: seeded data
order and RNG states (randomness.py), the folder lock (run_folder.py), torchrun (distributed.py), mixed precision
(precision.py)."""
