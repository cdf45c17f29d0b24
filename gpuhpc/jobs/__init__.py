"""Jobs: specs (spec.py), sbatch rendering (render.py), submission and the Job handle
(api.py), and the checkpoint/requeue contract (checkpoint.py). See docs/jobs.md."""
