"""The replay beside the golden file: three jobs on one 8-GPU node under FIFO and Dike, each
result worked out by hand below from the simulator's documented rules, not by running it.

tests/golden catches a change of the replay; this catches an error in it: a start one second
late, a wait or JCT measured from the wrong time, attained GPU-hours with the wrong GPU count, a
requeue that keeps or loses the wrong work.

The rules used (sim/kernel/records.py SimSettings, the defaults unless given here; docs/replay.md):
- the main scheduler passes at every change at once (batch_sched_delay_s 0), so a job that fits
  starts when it is submitted, and a job waiting for GPUs starts when the run before it ends;
- a run ends its work after it starts (run_overhead_s 0), and the policy's cycles fall every
  interval_s = 60 s from the first submission (t = 0), its writes reaching Slurm at once
  (cycle_latency_s 0);
- a requeue loses the work since the last checkpoint (checkpoint_interval_s 1800) and the run
  after it first pays restart_cost_s = 120 s; a requeued job may start again requeue_hold_s =
  121 s after its requeue;
- wait = time pending (every pending period), JCT = end - submit, GPU-seconds = GPUs x wall time
  of every run (the restart included), lost GPU-seconds = GPUs x (the work a requeue lost + the
  restart the next run pays) (JobResult.lost_gpu_s).
"""

from __future__ import annotations

from test_sim import job, simulate

from dike_slurm.registry import default_registry

#            job  submit  GPUs  work (s)  user
TRACE = [job(1, 0, 8, 3600, user="alice"),  # the whole node, one hour
         job(2, 100, 4, 600, user="bob"),  # half the node
         job(3, 200, 4, 300, user="carol")]  # the other half


def outcome(results) -> dict[int, tuple[float, float, float, float, float, int, float]]:
    """By job: (start, end, wait, JCT, attained GPU-hours, requeues, lost GPU-hours)."""
    return {r.job_id: (r.start, r.end, r.wait_s, r.jct_s, r.gpu_seconds / 3600, r.preemptions, r.lost_gpu_s / 3600)
            for r in results.values()}


def test_fifo_by_hand():
    results, _ = simulate(TRACE)
    # Job 1 starts at its submission (t=0, the node is free) and runs its hour: 0 -> 3600.
    # Jobs 2 and 3 (4 GPUs each) find the node full; at 3600 both fit at once: 2 runs 3600 -> 4200,
    # 3 runs 3600 -> 3900. Waits: 0; 3600 - 100 = 3500; 3600 - 200 = 3400.
    # JCTs: 3600; 4200 - 100 = 4100; 3900 - 200 = 3700.
    # GPU-hours: 8 x 1 h = 8; 4 x 600 s = 2400 GPU-s = 2/3 h; 4 x 300 s = 1200 GPU-s = 1/3 h. No requeue.
    assert outcome(results) == {
        1: (0, 3600, 0, 3600, 8.0, 0, 0.0),
        2: (3600, 4200, 3500, 4100, 2400 / 3600, 0, 0.0),
        3: (3600, 3900, 3400, 3700, 1200 / 3600, 0, 0.0),
    }
    # mean JCT (3600 + 4100 + 3700) / 3 = 3800 s
    assert sum(r.jct_s for r in results.values()) / 3 == 3800


def test_dike_by_hand():
    dike = default_registry().create("dike")
    # Two levels split at 1 GPU-hour; a run may be cut after 300 s; no placement steering (one node).
    params = dike.Params(levels=2, thresholds_gpuh=[1.0], min_runtime_s=300, consolidate=False,
                         steer_light_jobs=False)
    results, simulator = simulate(TRACE, dike, params)
    # Job 1 starts at 0 and attains 8 GPU-s per second: 1 GPU-hour (3600 GPU-s) at t = 450. The
    # cycle of t=420 sees 3360 GPU-s (level 0), the cycle of t=480 sees 3840 (level 1).
    # At t=480 jobs 2 and 3 (level 0, never ran) are blocked: no GPU is free. Job 1 is of a worse
    # level and has run 480 s >= min_runtime_s 300: it is requeued at 480. Its 480 s of work are
    # lost (no checkpoint before 1800 s).
    # At 480 jobs 2 and 3 start: 2 runs 480 -> 1080, 3 runs 480 -> 780.
    # Job 1 may start again at 480 + 121 = 601, but needs the whole node: at 1080. Its second run
    # pays 120 s of restart and the whole hour of work again: 1080 -> 1080 + 120 + 3600 = 4800.
    # Job 1: waited 0 (first run) + 1080 - 480 = 600; JCT 4800; GPU-s 8 x (480 + 3720) = 33600
    # = 9 1/3 GPU-hours, of which 8 x (480 lost + 120 restart) = 4800 GPU-s = 1 1/3 GPU-hours lost;
    # one requeue.
    # Job 2: waited 480 - 100 = 380, JCT 1080 - 100 = 980, 4 x 600 = 2400 GPU-s.
    # Job 3: waited 480 - 200 = 280, JCT 780 - 200 = 580, 4 x 300 = 1200 GPU-s.
    assert outcome(results) == {
        1: (0, 4800, 600, 4800, 33600 / 3600, 1, 4800 / 3600),
        2: (480, 1080, 380, 980, 2400 / 3600, 0, 0.0),
        3: (480, 780, 280, 580, 1200 / 3600, 0, 0.0),
    }
    assert simulator.stats.preemptions == 1
    # the level each job last had: job 1 demoted (3840 GPU-s >= 1 GPU-hour), jobs 2 and 3 never
    # reach it (2400 and 1200 GPU-s)
    assert {r.job_id: r.level for r in results.values()} == {1: 1, 2: 0, 3: 0}
    # mean JCT (4800 + 980 + 580) / 3 = 2120 s, against FIFO's 3800
    assert sum(r.jct_s for r in results.values()) / 3 == 2120
