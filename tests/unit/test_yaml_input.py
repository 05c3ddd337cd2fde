"""The YAML loader for untrusted documents: safe_load minus aliases, with a node bound."""

import pytest

from shared.specs.yaml_input import UnsafeYaml, load_untrusted


def test_the_node_bound_refuses_a_flat_but_huge_yaml_document():
    assert load_untrusted("a: [1, 2, 3]") == {"a": [1, 2, 3]}
    with pytest.raises(UnsafeYaml, match="too many YAML nodes"):
        load_untrusted("[" + ", ".join("1" for _ in range(200)) + "]", max_nodes=100)
