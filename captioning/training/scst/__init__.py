"""Self-critical sequence training (objective=scst, captioning/training/objectives.py): sampling captions from the
captioner (sampling.py) and scoring them against their image's training references (rewards.py)."""
