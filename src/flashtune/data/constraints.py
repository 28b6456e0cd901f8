"""Definition constraints: checked against a whitelist, then interpreted; never `eval`ed.

Constraints come with datasets written by strangers, so a constraint is data, not code.
`check_constraint` parses it (`ast.parse(expr, mode="eval")`) and accepts only:

- constants: int, float, bool (no strings, bytes, None);
- names: the definition's axis names and input names;
- arithmetic `+ - * / // % **` (integer powers bounded in size), bitwise `& | ^` (for
  boolean tensors), unary `- + ~ not`, boolean `and`/`or`;
- comparisons `== != < <= > >=`, chains included;
- attribute `.shape` (then indexed: `q.shape[0]`), and the method call `.item()`;
- indexing and slicing: `x[-1]`, `x[1:]`, `x[:, 0]`;
- list and tuple literals (as arguments: `all([a, b])`);
- calls of the builtins in CONSTRAINT_FUNCTIONS: len, min, max, abs, int, all, any, sum;
  positional arguments only.

Everything else (other attributes, dunders included, other calls, keywords, lambdas,
comprehensions, strings, starred arguments, `torch`) is refused with a message naming the
constraint and the construct. `evaluate_constraint` then walks the checked tree itself, so
there is no namespace to escape from. A tensor counts as true when all its elements are
(`holds`); chained comparisons of tensors combine element-wise.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Collection, Mapping
from typing import Any

__all__ = [
    "CONSTRAINT_FUNCTIONS",
    "ConstraintNotAllowed",
    "check_constraint",
    "evaluate_constraint",
    "holds",
]

# The builtins a constraint may call. All are pure and bounded by the size of their
# arguments; the schema registry's tests and the definition validator share this list.
CONSTRAINT_FUNCTIONS: tuple[str, ...] = ("len", "min", "max", "abs", "int", "all", "any", "sum")
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "all": all,
    "any": any,
    "sum": sum,
}

# Corpus constraints are ~40 characters and 4 levels deep; these bounds only keep a hostile
# one from exhausting the parser or this module's recursion.
MAX_LENGTH = 1000
MAX_DEPTH = 50
# An integer power whose result would exceed this many bits is refused: `9**9**9` would
# otherwise hang the process that synthesizes inputs.
MAX_INT_BITS = 4096

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


class ConstraintNotAllowed(ValueError):
    """A constraint that does not parse or uses something outside the whitelist.

    `reason` is the problem alone ("does not parse: ...", "is not allowed: ..."); the
    message also quotes the constraint.
    """

    def __init__(self, expr: str, reason: str) -> None:
        self.expr = expr
        self.reason = reason
        super().__init__(f"constraint {expr!r} {reason}")


def check_constraint(expr: str, names: Collection[str] | None = None) -> ast.Expression:
    """Parse `expr` and check it against the whitelist; return the tree.

    names: the axis and input names it may use; None checks the form only (used where the
    names are not known yet, e.g. a field validator).
    """
    if not isinstance(expr, str):
        raise ConstraintNotAllowed(str(expr), "is not a string")
    if len(expr) > MAX_LENGTH:
        raise ConstraintNotAllowed(
            expr[:60] + "...", f"is not allowed: longer than {MAX_LENGTH} characters"
        )
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ConstraintNotAllowed(expr, f"does not parse: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        raise ConstraintNotAllowed(expr, f"does not parse: {exc}") from None
    _Checker(expr, None if names is None else frozenset(names)).check(tree.body, 0)
    return tree


class _Checker:
    def __init__(self, expr: str, names: frozenset[str] | None) -> None:
        self.expr = expr
        self.names = names

    def refuse(self, what: str) -> ConstraintNotAllowed:
        return ConstraintNotAllowed(self.expr, f"is not allowed: {what}")

    def check(self, node: ast.AST, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self.refuse(f"nested deeper than {MAX_DEPTH} levels")
        d = depth + 1
        if isinstance(node, ast.Constant):
            # bool is an int; complex, str, bytes, None and Ellipsis are refused.
            if type(node.value) not in (int, float, bool):
                raise self.refuse(f"constant {node.value!r} (only numbers and booleans)")
        elif isinstance(node, ast.Name):
            if self.names is not None and node.id not in self.names:
                raise self.refuse(f"name {node.id!r} is neither an axis nor an input")
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY:
                raise self.refuse(f"operator {type(node.op).__name__}")
            self.check(node.left, d)
            self.check(node.right, d)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.Not) and type(node.op) not in _UNARY:
                raise self.refuse(f"operator {type(node.op).__name__}")
            self.check(node.operand, d)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                self.check(value, d)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _COMPARE:
                    raise self.refuse(f"comparison {type(op).__name__}")
            for operand in (node.left, *node.comparators):
                self.check(operand, d)
        elif isinstance(node, ast.Attribute):
            if node.attr != "shape":
                raise self.refuse(f"attribute .{node.attr} (only .shape and .item())")
            self.check(node.value, d)
        elif isinstance(node, ast.Call):
            self.check_call(node, d)
        elif isinstance(node, ast.Subscript):
            self.check(node.value, d)
            self.check(node.slice, d)
        elif isinstance(node, ast.Slice):
            for part in (node.lower, node.upper, node.step):
                if part is not None:
                    self.check(part, d)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                self.check(element, d)
        else:
            raise self.refuse(f"{type(node).__name__} expression")

    def check_call(self, node: ast.Call, depth: int) -> None:
        if node.keywords:
            raise self.refuse("keyword arguments")
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr != "item" or node.args:
                raise self.refuse(f"method call .{func.attr}(...) (only .item())")
            self.check(func.value, depth)
            return
        if not isinstance(func, ast.Name) or func.id not in _FUNCTIONS:
            called = func.id if isinstance(func, ast.Name) else type(func).__name__
            raise self.refuse(
                f"call of {called!r} (allowed: {', '.join(CONSTRAINT_FUNCTIONS)}, .item())"
            )
        for arg in node.args:
            self.check(arg, depth)  # a Starred argument is refused there


def evaluate_constraint(expr: str, values: Mapping[str, Any]) -> Any:
    """Check `expr` (names: the keys of `values`) and compute it. Raises ConstraintNotAllowed
    for a refused constraint, and whatever the arithmetic raises (TypeError, IndexError,
    ZeroDivisionError, ...) for one that cannot be computed on these values."""
    tree = check_constraint(expr, values.keys())
    return _evaluate(tree.body, values)


def holds(value: Any) -> bool:
    """A constraint's truth: a tensor holds when every element does (an empty one holds)."""
    if _is_tensor(value):
        return bool(value.all())
    return bool(value)


def _is_tensor(value: Any) -> bool:
    import torch  # imported here so that loading models does not need torch

    return isinstance(value, torch.Tensor)


def _both(a: Any, b: Any) -> Any:
    if _is_tensor(a) or _is_tensor(b):
        import torch

        return torch.logical_and(torch.as_tensor(a), torch.as_tensor(b))
    return a and b


def _power(base: Any, exponent: Any) -> Any:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and abs(base) > 1
        and exponent * abs(base).bit_length() > MAX_INT_BITS
    ):
        raise OverflowError(f"{base} ** {exponent} exceeds {MAX_INT_BITS} bits")
    return base**exponent


def _arithmetic_operand(value: Any) -> Any:
    # Lists and tuples (shapes included) are for arguments and indexing only: `[0] * 10**9`
    # or `x.shape * 10**9` would exhaust memory.
    if isinstance(value, (list, tuple)):
        raise TypeError(f"arithmetic on a {type(value).__name__} is not supported")
    return value


def _evaluate(node: ast.AST, values: Mapping[str, Any]) -> Any:
    # Only the node types _Checker admits reach here.
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.BinOp):
        left = _arithmetic_operand(_evaluate(node.left, values))
        right = _arithmetic_operand(_evaluate(node.right, values))
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, values)
        if isinstance(node.op, ast.Not):
            return not holds(operand)
        return _UNARY[type(node.op)](operand)
    if isinstance(node, ast.BoolOp):
        want = isinstance(node.op, ast.Or)  # `or` stops at the first true value
        for value in node.values:
            if holds(_evaluate(value, values)) == want:
                return want
        return not want
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, values)
        result: Any = True
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(comparator, values)
            pair = _COMPARE[type(op)](left, right)
            if len(node.ops) == 1:
                return pair  # unchained: keep the tensor, so `sum(x > 0)` works
            result = _both(result, pair)
            if not _is_tensor(result) and not result:
                return False
            left = right
        return result
    if isinstance(node, ast.Attribute):  # .shape
        return _evaluate(node.value, values).shape
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):  # .item()
            return _evaluate(node.func.value, values).item()
        assert isinstance(node.func, ast.Name)
        return _FUNCTIONS[node.func.id](*(_evaluate(a, values) for a in node.args))
    if isinstance(node, ast.Subscript):
        return _evaluate(node.value, values)[_evaluate(node.slice, values)]
    if isinstance(node, ast.Slice):
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else _evaluate(p, values) for p in parts))
    if isinstance(node, ast.Tuple):
        return tuple(_evaluate(e, values) for e in node.elts)
    if isinstance(node, ast.List):
        return [_evaluate(e, values) for e in node.elts]
    raise AssertionError(f"unchecked node {type(node).__name__}")  # pragma: no cover
