"""Jobs: specs (spec.py), sbatch rendering (render.py), submission (api.py: ``submit``;
script_mode.py, python_mode.py, submitit_adapters.py, admission.py), the Job handle
(handle.py), one watcher for many jobs (watch.py), and the checkpoint/requeue contract
(checkpoint.py). See docs/jobs.md."""
