"""OpenRFT's own reward Lambda in the shape of aws-samples' GSM8K reward function for Bedrock RFT: the
reference under ``metadata.reference_answer.final_answer``, the answer taken strictly after ``####``, and an
extra answer key beside the contract's (``reward_components``)."""

import re


def lambda_handler(event, context):
    results = []
    for item in event:
        reference = (item.get("metadata") or {}).get("reference_answer", {}).get("final_answer")
        answer = ""
        for message in item.get("messages", []):
            if message.get("role") == "assistant":
                answer = message.get("content", "")
        found = re.findall(r"#### (\-?[0-9\.\,]+)", answer[-300:])
        final = found[-1].replace(",", "").replace("$", "") if found else None
        score = 1.0 if reference and final == reference else 0.0
        results.append({"id": item.get("id"), "aggregate_reward_score": score, "reward_components": {"correct": score}})
    return results
