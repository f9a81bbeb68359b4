"""A test helper: check that generated pyautogui code can do nothing but call pyautogui."""

from __future__ import annotations

import ast

from vmenv.actions import SPECIAL_ACTIONS

#: Every pyautogui function ``to_pyautogui`` may call.
PYAUTOGUI_FUNCTIONS = frozenset(
    {"click", "moveTo", "dragTo", "typewrite", "hotkey", "press", "scroll", "hscroll"})


def _literal(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp):  # -5 is USub(Constant(5)) in the tree
        return (isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)
                and type(node.operand.value) in (int, float))
    return isinstance(node, ast.Constant) and type(node.value) in (int, float, str)


def assert_pyautogui_calls_only(code: str) -> list[ast.Call]:
    """Every statement is ``pyautogui.<known function>(<literals>)`` and there is one at
    least: nothing else can run.  Returns the calls."""
    calls = []
    for stmt in ast.parse(code).body:
        assert isinstance(stmt, ast.Expr), ast.dump(stmt)
        call = stmt.value
        assert isinstance(call, ast.Call), ast.dump(stmt)
        func = call.func
        assert isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name), ast.dump(call)
        assert func.value.id == "pyautogui" and func.attr in PYAUTOGUI_FUNCTIONS, ast.dump(call)
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            assert _literal(arg), ast.dump(arg)
        assert all(k.arg is not None for k in call.keywords), ast.dump(call)  # no **kwargs
        calls.append(call)
    assert calls, code
    return calls


def assert_safe_code(code: str) -> None:
    """``code`` is one of OSWorld's special actions or pyautogui calls with literals."""
    if code not in SPECIAL_ACTIONS:
        assert_pyautogui_calls_only(code)
