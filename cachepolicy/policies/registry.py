"""The policy registry: every cache policy by its name.

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

#: name -> policy class, built-in and user-registered
POLICIES: dict[str, type[CachePolicy]] = {}


def register(cls: type[CachePolicy]) -> type[CachePolicy]:
    """Class decorator: make a policy available by its ``name``."""
    if cls.name in POLICIES:
        raise PolicyError(f"a policy named {cls.name!r} is already registered")
    POLICIES[cls.name] = cls
    return cls


def pinning_policies() -> str:
    """The policies whose layout can pin screenshots, for messages."""
    return ", ".join(sorted(name for name, cls in POLICIES.items() if cls.pins))


def make_policy(name: str, model: ModelInfo, kit: PromptKit, **options: object) -> CachePolicy:
    """Instantiate a registered policy for a model; unknown names get the list of known ones."""
    if name not in POLICIES:
        raise PolicyError(f"unknown cache policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    return POLICIES[name](model, kit, **options)
