"""The policy registry: every cache policy by its name (a ``cachepolicy.registry.Registry``,
the shape the profiles and envs share).

Policies register themselves with ``@register`` when their module is imported; the
package's ``__init__`` imports the built-in ones, and since importing this module imports the
package first, ``make_policy`` always sees them.  The registry sits beside the policies, not
in ``cachepolicy.base`` (which they subclass), so the imports run one way: a policy imports
``base`` and this module, neither imports a policy.
"""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.errors import PolicyError
from cachepolicy.layouts import PromptKit
from cachepolicy.plan import ModelInfo
from cachepolicy.registry import Registry, UnknownNameError


class UnknownPolicyError(UnknownNameError, PolicyError):
    """No cache policy has that name (a ``PolicyError`` too, as it always was)."""


#: name -> policy class, built-in and user-registered; ``names()`` sorted (the display
#: order, built-ins first, is ``cachepolicy.policies.names()``)
POLICIES: Registry[type[CachePolicy]] = Registry("cache policy", error=UnknownPolicyError,
                                                 sort=True)


def register(cls: type[CachePolicy]) -> type[CachePolicy]:
    """Class decorator: make a policy available by its ``name``."""
    return POLICIES.register(cls)


def pinning_policies() -> str:
    """The policies whose layout can pin screenshots, for messages."""
    return ", ".join(name for name, cls in POLICIES.items() if cls.pins)


def make_policy(name: str, model: ModelInfo, kit: PromptKit, **options: object) -> CachePolicy:
    """Instantiate a registered policy for a model; unknown names raise ``UnknownPolicyError``
    listing the known ones."""
    return POLICIES.get(name)(model, kit, **options)
