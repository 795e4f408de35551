import pytest

from openrft.rewards.formula import FormulaError, FormulaRuntimeError, compile_formula


@pytest.mark.parametrize(
    ("source", "values", "expected"),
    [
        ("0.5 * a + 0.5 * b", {"a": 1.0, "b": 0.0}, 0.5),
        ("a + b * c", {"a": 1, "b": 2, "c": 3}, 7.0),
        ("(a + b) * c", {"a": 1, "b": 2, "c": 3}, 9.0),
        ("2 ^ 3 ^ 2", {}, 512.0),  # right-associative
        ("-2 ^ 2", {}, -4.0),  # ^ binds tighter than unary minus
        ("10 - 4 - 3", {}, 3.0),  # left-associative
        ("8 / 4 / 2", {}, 1.0),
        ("min(a, b, 0.3) + max(a)", {"a": 0.2, "b": 0.5}, 0.4),
        ("abs(-1.5) + floor(2.7) + ceil(0.2)", {}, 4.5),
        ("sqrt(16) + log(exp(2)) + log(8, 2)", {}, 9.0),
        ("1e-1 + .5", {}, 0.6),
        ("a ** 2", {"a": 3}, 9.0),
    ],
)
def test_formula_values(source, values, expected):
    assert compile_formula(source).evaluate(values) == pytest.approx(expected)


def test_division_by_zero_is_a_runtime_error():
    formula = compile_formula("a / (b - b)", {"a", "b"})
    with pytest.raises(FormulaRuntimeError, match="divides by zero"):
        formula.evaluate({"a": 1.0, "b": 2.0})


@pytest.mark.parametrize("source", ["sqrt(-1)", "log(0)", "(-8) ^ 0.5", "exp(1000)"])
def test_domain_errors(source):
    with pytest.raises(FormulaRuntimeError):
        compile_formula(source).evaluate({})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("a +", "expected a number"),
        ("foo(1)", "unknown function 'foo'"),
        ("2 $ 3", "unexpected character '\\$' at position 2"),
        ("(a", "expected '\\)'"),
        ("abs(1, 2)", "takes 1 argument"),
        ("__import__(1)", "unknown function '__import__'"),
        ("a.b", "unexpected character '\\.'"),
        ("c", "names c that are not graders"),
        ("", "is empty"),
    ],
)
def test_formula_errors(source, message):
    with pytest.raises(FormulaError, match=message):
        compile_formula(source, {"a", "b"})
