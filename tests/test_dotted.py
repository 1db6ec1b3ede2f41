"""dotted_get: strict without a default (a missing key raises), lenient with one (missing or None -> default)."""

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from hybridrl.dotted import dotted_get


def test_strict_reads_nested_dicts_and_dictconfigs_and_raises_on_a_missing_key():
    tree = {"a": {"b": {"c": 3}, "n": None}}
    for c in (tree, OmegaConf.create(tree)):
        assert dotted_get(c, "a.b.c") == 3
        assert dotted_get(c, "a.n") is None
        with pytest.raises(KeyError):
            dotted_get(c, "a.x")


def test_lenient_returns_the_default_for_missing_or_none_and_reads_objects_by_attribute():
    c = {"a": {"b": 0, "n": None}, "obj": SimpleNamespace(x=SimpleNamespace(y=5))}
    assert dotted_get(c, "a.b", 7) == 0
    assert dotted_get(c, "a.n", 7) == 7
    assert dotted_get(c, "a.n.deeper", 7) == 7
    assert dotted_get(c, "a.missing", None) is None
    assert dotted_get(c, "obj.x.y", 1) == 5
    assert dotted_get(c, "obj.x.z", 1) == 1


def test_dotted_leaves_flattens_to_leaf_keys_keeping_empty_mappings_and_lists():
    from hybridrl.dotted import dotted_leaves

    tree = {"a": {"b": {"c": 1}, "d": [1, 2]}, "e": {}, "f": None}
    assert dotted_leaves(tree) == {"a.b.c": 1, "a.d": [1, 2], "e": {}, "f": None}
