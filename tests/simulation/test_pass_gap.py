"""Event-driven passes are held at least the pass gap apart (as the live decider holds them
`decider.min_tick_gap_s` apart), which is what makes a dense trace cheap to simulate; a memory
window that becomes satisfied still gets its pass at once (the live urgent pass), and a change
held back is decided on later, never dropped."""

from shared.infra.config import load_config
from sim.cluster import Topology
from sim.simulator import SimOptions, Simulation
from sim.traces import read_trace
from sim.workload import enrich

GAP_S = 60.0


def simulate(small_trace, gap_s: float):
    sim = Simulation(
        enrich(read_trace(small_trace), 8), Topology(96), load_config(), "adc", SimOptions(pass_gap_s=gap_s)
    )
    passes, wakes = [], set()
    run_pass, memory_event = sim._pass, sim._memory_event

    def recorded_pass(now):
        passes.append(now)
        run_pass(now)

    def recorded_memory_event(job, kind, now):
        acted = memory_event(job, kind, now)
        if acted and kind == "wake":
            wakes.add(now)
        return acted

    sim._pass, sim._memory_event = recorded_pass, recorded_memory_event
    return sim.run(), passes, wakes


def test_passes_keep_the_gap_and_a_satisfied_memory_window_passes_at_once(small_trace):
    result, passes, wakes = simulate(small_trace, GAP_S)
    close = [(a, b) for a, b in zip(passes, passes[1:]) if b - a < GAP_S]
    assert close, "no memory window was satisfied within the gap: the urgent path went unexercised"
    assert all(b in wakes for _, b in close), [(a, b) for a, b in close if b not in wakes][:5]
    assert all(j.finish_s is not None for j in result.jobs)  # held-back changes were decided on later
    c = result.counters
    assert c.memory_spikes >= 5 and c.oom_crashes <= 0.1 * c.memory_spikes  # moved in time, as without a gap

    ungapped, ungapped_passes, _ = simulate(small_trace, 0.0)
    assert len(passes) < len(ungapped_passes)
    assert min(b - a for a, b in zip(ungapped_passes, ungapped_passes[1:])) < GAP_S
