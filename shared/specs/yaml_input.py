"""YAML from outside (a job spec, a policy file): safe_load minus what makes it dangerous.

Aliases let a few hundred bytes expand into gigabytes (the "billion laughs"), and a spec
never needs them, so they are refused at the first one, before anything walks the document.
The node count is bounded too, so a flat but huge document is refused while it is parsed.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_NODES = 100_000


class UnsafeYaml(yaml.YAMLError):
    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str, max_nodes: int) -> None:
        super().__init__(stream)
        self._nodes_left = max_nodes

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise UnsafeYaml(f"aliases (*{event.anchor}) are not accepted; write the value out", event.start_mark)
        self._nodes_left -= 1
        if self._nodes_left < 0:
            raise UnsafeYaml("too many YAML nodes", self.peek_event().start_mark)
        return super().compose_node(parent, index)


def load_untrusted(text: str, max_nodes: int = MAX_NODES) -> Any:
    """Like yaml.safe_load, but refuses aliases and documents of more than `max_nodes` nodes."""
    loader = _BoundedLoader(text, max_nodes)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
