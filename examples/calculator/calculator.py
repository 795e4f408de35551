"""The calculator tool of the example: ``calculator(expression)`` evaluates + - * / and parentheses.

Runs in the reward sandbox (``tools.functions.calculator`` in recipe.yaml): a single file, standard library only.
"""

import ast
import operator

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _value(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    raise ValueError(f"not arithmetic: {ast.unparse(node)}")


def calculator(expression: str) -> str:
    """The value of ``expression``, as an integer when it is one."""
    result = _value(ast.parse(expression, mode="eval").body)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)
