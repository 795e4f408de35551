"""An agent of its own: a plain multi-turn loop on the official ``openai`` client, with one tool.

Nothing here knows about OpenRFT. Trained, it is given a ``base_url`` that reaches the job's agent routes;
in use, any OpenAI-compatible server of the trained model (``openrft serve-model``, vLLM). Run it alone:

    python agent.py --base-url http://127.0.0.1:8000/v1 --model calculator "What is 347*29?"
"""

from __future__ import annotations

import argparse
import ast
import json
import operator

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluates an arithmetic expression: numbers, + - * / and parentheses",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _value(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("not arithmetic")


def calculator(expression: str) -> str:
    result = _value(ast.parse(expression, mode="eval").body)
    return str(int(result) if isinstance(result, float) and result.is_integer() else result)


def run(client: OpenAI, question: str, model: str = "calculator", max_turns: int = 3) -> str:
    """Answer ``question``: ask the model, run the calculator calls it makes, until it answers."""
    messages = [{"role": "user", "content": question}]
    for _ in range(max_turns):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as exc:  # the model's mistake goes back to it as the tool's answer
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="calculator")
    parser.add_argument("--api-key", default="none")
    args = parser.parse_args()
    print(run(OpenAI(base_url=args.base_url, api_key=args.api_key), args.question, args.model))
