"""The texts randomized tasks draw from: words to type, codes, button labels, dialog texts.

``TRAIN_WORDS`` mixes common words with words a BPE tokenizer spells in several pieces
(kvagent, quokka, xylograph, r2d2...), so typing them means reading them letter by letter.
``EVAL_ONLY_WORDS`` are never drawn for a training seed (see ``seeds``): an evaluation on held-out
seeds also meets words the model never typed.  Codes avoid look-alike characters (0/O, 1/I/L,
5/S, 8/B).  Every word and label is ASCII without quotes, so instructions can quote them.
"""

from __future__ import annotations

TRAIN_WORDS: tuple[str, ...] = (
    "hello", "garden", "window", "orange", "river", "planet", "silver", "coffee", "paper",
    "yellow", "winter", "pencil", "rocket", "candle", "basket", "forest", "guitar", "ladder",
    "marble", "pepper", "kvagent", "quokka", "xylograph", "zephyr", "fjord", "mnemonic",
    "sphinx", "kumquat", "zigzag", "wombat", "plinth", "quasar", "nymph", "gherkin", "oxbow",
    "jinx", "yodel", "vortex", "pixelate", "llama", "r2d2", "abc123", "x42", "qwerty",
    "unzip", "grep", "Paris", "Oslo", "Zurich", "Kyoto", "snackbar", "dewdrop", "blimp",
    "mauve", "taffeta", "cobweb", "nutmeg", "walrus", "tundra", "ziggurat",
)
EVAL_ONLY_WORDS: tuple[str, ...] = (
    "lantern", "meadow", "bismuth", "quince", "kelp", "xenon", "zodiac", "pumice", "Lisbon",
    "okapi", "fennel", "gizmo", "v8motor", "hyrax", "jackal", "pewter",
)

#: Code characters (no look-alikes) and code length.
CODE_ALPHABET = "ACDEFGHJKMNPQRTUVWXYZ234679"
CODE_LEN = 4

#: The button labels of ``dialog-button`` (at most ten words; ids are their lowercase forms).
BUTTON_WORDS: tuple[str, ...] = (
    "Save", "Discard", "Retry", "Close", "Apply", "Cancel", "Delete", "Keep", "Open", "Skip",
)
MENU_LABELS: tuple[str, ...] = ("Apps", "Menu", "Start", "Launch")

CONFIRM_TITLES: tuple[str, ...] = ("Confirm", "Please confirm", "Question", "Warning")
CONFIRM_MESSAGES: tuple[str, ...] = (
    "Discard unsaved changes?", "Delete the selected file?", "Overwrite report.txt?",
    "Install the update now?", "Empty the trash?", "Restart the app now?",
)
CHOICE_TITLES: tuple[str, ...] = ("Choose", "Action needed", "Question", "Attention")
CHOICE_MESSAGES: tuple[str, ...] = (
    "What should happen to draft.txt?", "The download failed.", "Settings were changed.",
    "report.txt is open elsewhere.", "The note has unsaved changes.",
)
NOTICE_TITLES: tuple[str, ...] = ("Notice", "Your code", "Remember this", "Message")
NOTICE_MESSAGES: tuple[str, ...] = (
    "Remember this code:", "Your one-time code:", "Note this code:",
)
NOTICE_BUTTONS: tuple[str, ...] = ("Got it", "OK", "Close")
#: (title, message, button labels) of pop-ups that appear uninvited (perturbations).
POPUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Update", "Updates are available.", ("Later", "Close")),
    ("Reminder", "Stand up and stretch.", ("Close",)),
    ("Battery", "Battery at 20%.", ("OK",)),
    ("Tip", "Apps open from icons.", ("Close",)),
)
