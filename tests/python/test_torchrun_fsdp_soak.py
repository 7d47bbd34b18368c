# ctest-labels: torchrun soak
"""test_torchrun_fsdp's kill-and-resume with 24 kills (about 5 minutes on 2 cores): behind the
soak label, `ctest --test-dir build -L soak -R torchrun`."""

from test_torchrun_fsdp import kill_and_resume


def test_a_job_killed_24_times_at_random_moments_resumes_bit_exact(tmp_path):
    kill_and_resume(tmp_path, 24)
