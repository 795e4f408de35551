"""OpenRFT's own reward Lambda in a published style whose optional ``metrics_list`` items carry
``metric``/``value`` and no ``name``: the required ``aggregate_reward_score`` is what scores."""


def lambda_handler(event, context):
    out = []
    for sample in event:
        answer = sample["messages"][-1]["content"].strip()
        correct = 1.0 if answer == str(sample["reference_answer"]) else 0.0
        out.append(
            {
                "id": sample["id"],
                "aggregate_reward_score": correct,
                "metrics_list": [{"metric": "accuracy", "value": correct}],
            }
        )
    return out
