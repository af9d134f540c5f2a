"""The registry refuses a second class under a taken name (naming both classes and their
modules) unless the newcomer asks to override; re-importing a module is not a clash."""
import pytest

from domainbed import registry
from domainbed.algorithms.erm import ERM
from domainbed.registry import ALGORITHMS, RegistryClash, register_algorithm


def test_plugin_class_under_a_builtin_name_is_refused():
    class ERM(registry.get_algorithm_class("ERM")):  # a plug-in's own ERM
        pass
    with pytest.raises(RegistryClash) as info:
        register_algorithm("ERM")(ERM)
    message = str(info.value)
    assert "domainbed.algorithms.erm.ERM" in message
    assert f"{__name__}.test_plugin_class_under_a_builtin_name_is_refused.<locals>.ERM" \
        in message and "override=True" in message
    assert registry.get_algorithm_class("ERM") is not ERM


def test_explicit_override_replaces_and_survives_a_later_plain_registration():
    builtin = registry.get_algorithm_class("ERM")

    class MyERM(builtin):
        pass
    try:
        register_algorithm("ERM", override=True)(MyERM)
        assert registry.get_algorithm_class("ERM") is MyERM
        register_algorithm("ERM")(builtin)  # e.g. the built-ins imported afterwards
        assert registry.get_algorithm_class("ERM") is MyERM
    finally:
        ALGORITHMS.unregister("ERM")
        register_algorithm("ERM")(builtin)
    assert registry.get_algorithm_class("ERM") is ERM


def test_same_definition_registered_again_is_not_a_clash():
    def make():
        class Twin:
            pass
        return Twin
    reg = registry.Registry("thing", "domainbed.no_such_group", "json")
    reg.register("Twin")(make())
    reg.register("Twin")(make())  # a re-import of the same module
    assert reg.names() == ["Twin"]


def test_entry_point_under_a_taken_name_is_an_error(monkeypatch):
    class Builtin:
        pass

    class Foreign:
        pass

    class FakeEntryPoint:
        name, value = "Thing", "foreign_pkg:Foreign"

        def load(self):
            return Foreign
    reg = registry.Registry("thing", "domainbed.things", "json")
    reg.register("Thing")(Builtin)
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [FakeEntryPoint()])
    with pytest.raises(RegistryClash, match="'Thing' is already registered by .*Builtin; "
                                            "refusing .*Foreign"):
        reg.get("Thing")
