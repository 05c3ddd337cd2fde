"""The rules of consecutive passes run in one kept thread (no thread started per pass), and a
thread in which a rule overran is never handed work again."""

import asyncio
import threading

from services.decider.core import EngineCore
from services.decider.plugin import Rule, RuleConfig
from shared.infra.config import AdcConfig
from tests.unit.decider.builders import Cluster


class SlowConfig(RuleConfig):
    budget_ms: float = 50


def test_passes_share_the_rule_thread_until_a_rule_overruns_in_it():
    threads: list[int] = []
    slow_threads: list[int] = []
    release, finished = threading.Event(), threading.Event()

    def where(snapshot, config):
        threads.append(threading.get_ident())
        return []

    def slow(snapshot, config):  # held until the test lets it go: past its budget whatever the load
        slow_threads.append(threading.get_ident())
        release.wait(60)
        finished.set()
        return []

    core, snap = EngineCore(), Cluster().node("a", 1).snapshot()
    quick = {"where": Rule(name="where", decide=where, config=RuleConfig, precedence=200)}
    for _ in range(3):
        asyncio.run(core.evaluate(snap, quick, AdcConfig()))
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()

    with_slow = {**quick, "slow": Rule(name="slow", decide=slow, config=SlowConfig, precedence=10)}
    result = asyncio.run(core.evaluate(snap, with_slow, AdcConfig()))
    assert [i.kind for i in result.incidents] == ["rule.overrun"]
    assert slow_threads == [threads[0]]  # it overran in the kept thread ...
    assert threads[3] != threads[0]  # ... so the rest of that pass went on in another
    asyncio.run(core.evaluate(snap, quick, AdcConfig()))
    assert threads[4] == threads[3]  # which is kept in turn; the overrun one is not used again
    assert not finished.is_set()  # all of this while the overrun rule was still running
    release.set()
    assert finished.wait(10)
