"""Key names: pyautogui's list (our own copy), common aliases, and the grammar's subset.

pyautogui silently ignores key names it does not know, so an action naming one would do nothing
in the VM while the agent believes it pressed a key.  We therefore validate every key against
``KEY_NAMES`` (a copy of ``pyautogui.KEYBOARD_KEYS``; pyautogui is not a dependency).
"""

from __future__ import annotations

from vmenv.actions.errors import InvalidKeyError

_SINGLE_CHARS = (*"\t\n\r !\"#$%&'()*+,-./0123456789:;<=>?@[\\]^_`",
                 *"abcdefghijklmnopqrstuvwxyz{|}~")

_NAMED = (
    "accept add alt altleft altright apps backspace browserback browserfavorites browserforward "
    "browserhome browserrefresh browsersearch browserstop capslock clear convert ctrl ctrlleft "
    "ctrlright decimal del delete divide down end enter esc escape execute "
    "f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 f11 f12 f13 f14 f15 f16 f17 f18 f19 f20 f21 f22 f23 f24 "
    "final fn hanguel hangul hanja help home insert junja kana kanji launchapp1 launchapp2 "
    "launchmail launchmediaselect left modechange multiply nexttrack nonconvert "
    "num0 num1 num2 num3 num4 num5 num6 num7 num8 num9 numlock pagedown pageup pause pgdn pgup "
    "playpause prevtrack print printscreen prntscrn prtsc prtscr return right scrolllock select "
    "separator shift shiftleft shiftright sleep space stop subtract tab up volumedown volumemute "
    "volumeup win winleft winright yen command option optionleft optionright"
).split()

#: Every key name pyautogui accepts (``pyautogui.KEYBOARD_KEYS``).
KEY_NAMES: frozenset[str] = frozenset(_SINGLE_CHARS) | frozenset(_NAMED)

#: Spellings models commonly use for a pyautogui key name.
KEY_ALIASES: dict[str, str] = {
    "control": "ctrl", "ctl": "ctrl", "super": "win", "meta": "win", "windows": "win",
    "cmd": "command", "opt": "option", "arrowup": "up", "arrowdown": "down",
    "arrowleft": "left", "arrowright": "right", "arrow_up": "up", "arrow_down": "down",
    "arrow_left": "left", "arrow_right": "right", "page_up": "pageup", "page_down": "pagedown",
    "pgdown": "pagedown", "bksp": "backspace", "back_space": "backspace", "del_key": "delete",
    "caps_lock": "capslock", "print_screen": "printscreen", "ins": "insert", "spacebar": "space",
}

#: Modifier keys the grammar offers in ``hotkey(...)`` (short names keep outputs short).
GRAMMAR_MODIFIERS: tuple[str, ...] = ("ctrl", "shift", "alt", "win")

#: Named keys the grammar offers (a GUI-relevant subset; the parser accepts all KEY_NAMES).
#: Every name is at most 11 characters: the grammar's length bound depends on it.
GRAMMAR_NAMED_KEYS: tuple[str, ...] = (
    "enter", "tab", "space", "backspace", "delete", "escape", "esc", "home", "end", "pageup",
    "pagedown", "up", "down", "left", "right", "insert", "capslock", "printscreen",
    "ctrl", "shift", "alt", "win",
    *(f"f{i}" for i in range(1, 13)),
)


def normalize_key(name: str) -> str:
    """Return the pyautogui key name for ``name`` or raise ``InvalidKeyError``.

    Multi-character names are case-insensitive ("Enter" → "enter") and may be aliases
    ("Control" → "ctrl"); single characters are kept as given, except that an upper-case
    letter is lowered (pyautogui's key list only has lower-case letters).
    """
    if len(name) == 1:
        key = name.lower() if name.isascii() and name.isalpha() else name
    else:
        lowered = name.strip().lower()
        key = KEY_ALIASES.get(lowered, lowered)
    if key not in KEY_NAMES:
        raise InvalidKeyError(name)
    return key
