"""Slurm's documented time formats (sbatch(1), ``--time``) and what they mean, in seconds; shared
by tests/unit/slurm/test_durations.py and the check against sbatch+squeue
(tests/integration/slurm/test_durations_slurm.py)."""
SLURM_TIMES = [
    ("120", 120 * 60),                        # minutes: a bare number is minutes, not seconds
    ("5", 5 * 60),
    ("90:30", 90 * 60 + 30),                  # minutes:seconds
    ("0:05", 5),
    ("1:02:03", 3600 + 2 * 60 + 3),           # hours:minutes:seconds
    ("2-12", 2 * 86400 + 12 * 3600),          # days-hours: 2 days 12 HOURS
    ("2-12:30", 2 * 86400 + 12 * 3600 + 30 * 60),          # days-hours:minutes
    ("2-12:30:15", 2 * 86400 + 12 * 3600 + 30 * 60 + 15),  # days-hours:minutes:seconds
    ("1-00:00:00", 86400),
    ("INFINITE", None),
    ("UNLIMITED", None),
    ("1:75:00", 3600 + 75 * 60),              # Slurm carries out-of-range fields over
]
