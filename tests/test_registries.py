"""The policies, profiles and envs share one registry shape: the same verbs, one error base
whose message lists the known names, the same refusal of a name registered twice."""

from __future__ import annotations

from typing import ClassVar

import pytest

from cachepolicy.errors import PolicyError
from cachepolicy.policies import POLICIES, UnknownPolicyError, make_policy
from cachepolicy.registry import DuplicateNameError, Registry, UnknownNameError
from runtime import profiles
from runtime.profiles.registry import PROFILES
from runtime.run import envs

REGISTRIES = {
    "policies": (POLICIES, UnknownPolicyError, "cache policy"),
    "profiles": (PROFILES, profiles.UnknownProfileError, "profile"),
    "envs": (envs.ENVS, envs.UnknownEnvError, "env"),
}


@pytest.mark.parametrize("which", REGISTRIES)
def test_the_same_verbs_and_error_base(which: str) -> None:
    registry, error, kind = REGISTRIES[which]
    assert isinstance(registry, Registry) and issubclass(error, UnknownNameError)
    names = registry.names()
    assert len(names) >= 2 and list(registry) == list(names) and len(registry) == len(names)
    first = names[0]
    assert first in registry and "no-such-name" not in registry
    assert registry.get(first) is registry[first]
    assert [n for n, _ in registry.items()] == list(names)
    with pytest.raises(UnknownNameError) as caught:
        registry.get("no-such-name")
    exc = caught.value
    assert type(exc) is error and exc.name == "no-such-name" and exc.known == names
    assert str(exc) == f"unknown {kind} 'no-such-name'; known: {', '.join(names)}"
    # the one base is a KeyError (``registry[name]``) and a ValueError (a bad setting) alike
    assert isinstance(exc, KeyError) and isinstance(exc, ValueError)
    with pytest.raises(error):
        registry["no-such-name"]


def test_each_package_function_raises_its_registry_error() -> None:
    with pytest.raises(profiles.UnknownProfileError, match="known: kvagent, qwen3vl"):
        profiles.get("gpt")
    with pytest.raises(envs.UnknownEnvError, match="known: simdesk, replay"):
        envs.get("nope")
    with pytest.raises(PolicyError, match="unknown cache policy 'lru'; known: chrono-slot, evict, "):
        make_policy("lru", None, None)  # type: ignore[arg-type]  # refused before use


def test_chat_profiles_are_found_but_not_listed() -> None:
    assert profiles.get("chat").name == "chat"
    assert "chat" not in profiles.names()
    with pytest.raises(UnknownNameError) as caught:
        profiles.get("nope")
    assert "chat" not in caught.value.known


class _Thing:
    def __init__(self, name: str) -> None:
        self.name = name


class _UnknownThingError(UnknownNameError):
    pass


def test_register_duplicates_order_and_copies() -> None:
    things: Registry[_Thing] = Registry("thing", error=_UnknownThingError)
    b = things.register(_Thing("b"))
    things.register(_Thing("a"))
    things.register(_Thing("x"), name="c")  # a name of its own
    assert things.names() == ("b", "a", "c") and things.get("b") is b  # registration order
    with pytest.raises(DuplicateNameError, match="a thing named 'b' is registered already"):
        things.register(_Thing("b"))
    assert things.get("b") is b  # the first registration stands
    twin = things.copy()
    twin.register(_Thing("d"))
    assert "d" in twin and "d" not in things
    with pytest.raises(_UnknownThingError, match=r"^unknown thing 'd'; known: b, a, c$"):
        things.get("d")
    assert Registry("env", sort=True).register(_Thing("z")).name == "z"


def test_register_decorates_a_class() -> None:
    kinds: Registry[type] = Registry("kind", sort=True)

    @kinds.register
    class Later:
        name: ClassVar[str] = "later"

    @kinds.register
    class Early:
        name: ClassVar[str] = "early"

    assert kinds.names() == ("early", "later") and kinds.get("later") is Later
    with pytest.raises(DuplicateNameError, match="a kind named 'early'"):
        kinds.register(Early)
    with pytest.raises(ValueError, match="an env named 'simdesk' is registered already"):
        envs.ENVS.copy().register(envs.get("simdesk"))
