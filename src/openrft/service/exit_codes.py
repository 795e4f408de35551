"""A job process's exit status its worker acts on (beside the job's outcome, which the process records itself)."""

# "requeue my job": its Ray actors were lost with their node (job_process.py); it resumes from its last checkpoint
# on a new placement group once its worker has freed this one (worker.py)
RESUME_EXIT = 75  # EX_TEMPFAIL
