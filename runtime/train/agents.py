"""The shipped agents' shapes: a hybrid ``qwen35`` and an attention-only ``llama`` text model of
the same width, one vocabulary, and the cell projector (``cell_vision``) both read through.

The vocabulary is the forge's SentencePiece-style one plus whole-word pieces for what every
prompt says (the kvagent profile's system prompt, simdesk's instructions, the words on its
widgets and the action grammar), so a step's prompt is ~5x shorter than character by character
and a label the instruction names ("Terminal", "Cancel") is one token the model matches against
the screenshot. Words the agent *types* are deliberately not pieces: they stay spelled out, so a
The words simdesk's tasks type (``TYPED_WORDS``, held-out ones included) are whole pieces too,
so typing one is copying one token (``word_copy``: a designed head does it, and copies a held-out
word the same way); any other word is spelled out piece by piece. The demo screen's cell
centres are whole pieces (``X_PIECES``, ``Y_PIECES``); other digits stay single tokens.
"""

from __future__ import annotations

import attrs

from cachepolicy.forge import TextSpec
from cachepolicy.forge.tokenizer import Vocab, build_vocab
from runtime.train.cell_features import CELL
from vmenv.simdesk.words import BUTTON_WORDS, EVAL_ONLY_WORDS, TRAIN_WORDS

__all__ = ["AGENT_ARCHES", "AGENT_PIECES", "LABEL_PIECES", "AGENT_SCREEN", "LLAMA_ROPE_BASE",
           "SUB_X_PIECES", "SUB_Y_PIECES", "TYPED_WORDS", "X_PIECES", "Y_PIECES", "AgentShape",
           "agent_shape", "agent_vocab"]

N_VOCAB = 1536
N_VOCAB_SUB = 1664  # with the sub-cell pieces: room for them and their prefixes

_PROMPT = (
    "You are a GUI agent operating a desktop of pixels through screenshots Reply with exactly "
    "one action Coordinates are absolute screen Task Previous actions Screenshot Step seconds"
)
_GRAMMAR = ("click(", "double_click(", "right_click(", "move_to(", "drag(", "type(\"",
            "hotkey(", "press(\"", "scroll(", "wait(", "done()", "fail()", "enter", "ctrl")
_INSTRUCTIONS = (
    "the text field Notes and it Save its type into click A in open dialog notice first code "
    "Open Terminal window then app by clicking Close is write asks Confirm OK from menu taskbar "
    "on screen shows a disappears after your action so remember to Press button The behind "
    "other windows Bring front press Enter note In Type word of Switch Answer Launch Start now "
    "application Discard Delete unsaved changes selected file Restart Overwrite report Install "
    "update Empty trash Apply Retry Skip Cancel Keep"
)
_WIDGETS = ("Files Mail Music Photos Calculator Calendar Settings Clock Help Trash Apps Menu "
            "Reopen Home folders alarms")

#: The demo screen (640x384: 20 x 12 cells of the projector's 32 px) and its cell centres
#: as whole pieces: an x as ``"304"``, a y with the separator before it as ``", 176"``, so
#: ``click(304, 176)`` is ``click(`` ``304`` ``, 176`` ``)`` — one token per coordinate, the
#: y token right after the x token, x and y tokens disjoint (their embeddings can be the
#: projector's column and row one-hots).  Other numbers stay digit by digit or fall back
#: to shorter pieces.
AGENT_SCREEN = (640, 384)
X_PIECES = tuple(str(CELL // 2 + CELL * c) for c in range(AGENT_SCREEN[0] // CELL))
Y_PIECES = tuple(f", {CELL // 2 + CELL * r}" for r in range(AGENT_SCREEN[1] // CELL))
#: The sub-cell grid's off-centre points (``cell_labels.SUB_OFFSETS``: 8 px either side of a
#: cell's centre) as whole pieces too, for an agent made with them (``agent_vocab``):
#: ``SUB_X_PIECES[2 c]`` is column c's left point, ``[2 c + 1]`` its right one ("8", "24"
#: for column 0), and the y pieces likewise (", 8", ", 24" for row 0).
SUB_X_PIECES = tuple(str(CELL // 2 + CELL * c + o) for c in range(AGENT_SCREEN[0] // CELL)
                     for o in (-CELL // 4, CELL // 4))
SUB_Y_PIECES = tuple(f", {CELL // 2 + CELL * r + o}" for r in range(AGENT_SCREEN[1] // CELL)
                     for o in (-CELL // 4, CELL // 4))

#: The words simdesk's tasks type (training and held-out), each one piece without a leading
#: space: the action writes ``type("word")`` and the instruction quotes ``"word"``.
TYPED_WORDS: tuple[str, ...] = tuple(dict.fromkeys(TRAIN_WORDS + EVAL_ONLY_WORDS))

#: The system prompt's own spellings of the keyboard verbs (``…, type("text"), …``), pieces of
#: their own and ranked first, so ``,▁`` merges before ``▁t`` and the prompt's list tokenizes
#: apart from an action: ``▁type("`` then occurs in a prompt only where a history line shows a
#: typed step (what ``typed_flag`` detects).  Then words that start a line (no "▁" before
#: them) and the one key the expert presses, so the history is not spelled letter by letter.
_PROMPT_VERBS = (', type("', ', press("')
_LINE_WORDS = ("Step", "Screenshot", "Previous", "Task", "backspace")
#: A dialog button's label as dialog-button's instruction quotes it (``clicking "Apply".``):
#: the label with its closing quote is one piece (``"`` ``Apply"``), so a label piece occurs
#: only where an instruction names a button (a quoted message that starts with a label word,
#: ``"Discard unsaved changes?"``, tokenizes to the bare word); ``label_copy`` reads them.
LABEL_PIECES: tuple[str, ...] = tuple(f'{w}"' for w in BUTTON_WORDS)

#: Word pieces added to the forge's vocabulary (a leading space is SentencePiece's "▁").
AGENT_PIECES: tuple[str, ...] = tuple(dict.fromkeys(
    list(_PROMPT_VERBS) + list(_LINE_WORDS) + list(LABEL_PIECES)
    + [f" {w}" for w in f"{_PROMPT} {_INSTRUCTIONS} {_WIDGETS}".split()]
    + [f"{w}" for w in _GRAMMAR] + [f" {w}" for w in _GRAMMAR] + list(X_PIECES)
    + list(Y_PIECES) + list(TYPED_WORDS)
))

AGENT_ARCHES = ("qwen35", "llama")
#: llama rotates every head dim (llama.cpp requires it); with this base only the first 12
#: dims of a head turn noticeably over a prompt (as qwen35 rotates 12 of 48), so the other
#: 36 can match a cell's key wherever it is (``grounding.static_dims``)
LLAMA_ROPE_BASE = 1e18


@attrs.frozen
class AgentShape:
    """One agent's text model; the projector follows from it (``cell_vision``)."""

    spec: TextSpec

    @property
    def arch(self) -> str:
        return self.spec.arch


def agent_shape(arch: str, sub_cell: bool = False) -> AgentShape:
    """The shipped shape of ``arch`` ("qwen35": 2 Gated DeltaNet + 2 attention layers;
    "llama": 4 attention layers), ``sub_cell``: over ``agent_vocab(sub_cell=True)``;
    ValueError for another arch."""
    common = dict(size="agent", n_vocab=N_VOCAB_SUB if sub_cell else N_VOCAB, n_embd=192,
                  n_layer=4, n_head=4, n_head_kv=2, head_dim=48, n_ff=512, n_ctx_train=8192)
    if arch == "qwen35":
        return AgentShape(TextSpec(arch="qwen35", **common, full_attention_interval=2,
                                   ssm_state=32, ssm_groups=2, ssm_v_heads=4))
    if arch == "llama":
        return AgentShape(TextSpec(arch="llama", **common, rope_freq_base=LLAMA_ROPE_BASE))
    raise ValueError(f"no agent shape for arch {arch!r}; expected one of {AGENT_ARCHES}")


def agent_vocab(sub_cell: bool = False) -> Vocab:
    """The agents' vocabulary (the same for both arches); ``sub_cell``: with the sub-cell
    grid's pieces after the others (``SUB_X_PIECES``, ``SUB_Y_PIECES``), ``N_VOCAB_SUB``
    tokens."""
    extra = (*SUB_X_PIECES, *SUB_Y_PIECES) if sub_cell else ()
    return build_vocab(N_VOCAB_SUB if sub_cell else N_VOCAB, (*AGENT_PIECES, *extra))
