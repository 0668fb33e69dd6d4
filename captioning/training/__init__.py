"""Training: the loop (trainer.py) advancing a run's state (run_state.py: what a checkpoint holds, so a run resumes
exactly), the objectives (objectives.py, scst/) and their loss terms (losses.py), validation by real decoding
(validation.py, sharded under torchrun), and what makes runs exact and safe: seeded data order and RNG states
(randomness.py), one run per folder (run_folder.py), Ctrl-C and diverging runs (stop.py), torchrun's processes
(distributed.py), mixed precision (precision.py), TensorBoard (tensorboard.py)."""
