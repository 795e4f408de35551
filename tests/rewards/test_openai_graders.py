"""OpenAI graders against hand-computed scores."""

import pytest

from openrft.spec.errors import SpecError
from tests.rewards.helpers import example, score, scores

ITEM = example(reference_answer="Paris", city={"name": "Paris"}, tags=["a", "b"])


def check(operation, input="{{sample.output_text}}", reference="{{item.reference_answer}}"):
    return {
        "type": "openai_grader",
        "grader": {"type": "string_check", "name": "s", "input": input, "reference": reference, "operation": operation},
    }


def test_string_check_operations():
    texts = ["Paris", "paris", "I think Paris.", "", "Pa ris"]
    assert scores(check("eq"), texts, ITEM) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert scores(check("ne"), texts, ITEM) == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert scores(check("like"), texts, ITEM) == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert scores(check("ilike"), texts, ITEM) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_templates_reach_nested_item_fields_and_output_json():
    assert scores(check("eq", reference="{{item.city.name}}"), ["Paris"], ITEM) == [1.0]
    assert scores(check("eq", reference="{{item.tags[1]}}"), ["b"], ITEM) == [1.0]
    assert scores(check("eq", reference="{{item.tags.0}}"), ["a"], ITEM) == [1.0]
    grader = check("eq", input="{{sample.output_json.city}}")
    outcomes = score(
        grader,
        ['{"city": "Paris"}', '```json\n{"city": "Paris"}\n```', '{"city": "Rome"}', "Paris", '{"town": "Paris"}'],
        ITEM,
    )
    assert [o.score for o in outcomes[:3]] == [1.0, 1.0, 0.0]
    assert outcomes[3].error_kind == "parse_error"  # output is not JSON: never scored as 0
    assert outcomes[3].score is None
    assert outcomes[4].error_kind == "invalid_output"


def test_unicode_casefolding_in_ilike():
    ex = example(reference_answer="STRASSE")
    assert scores(check("ilike"), ["die straße"], ex) == [1.0]
    assert scores(check("eq"), ["日本"], example(reference_answer="日本")) == [1.0]


def similarity(metric):
    return {
        "type": "openai_grader",
        "grader": {
            "type": "text_similarity",
            "name": "t",
            "evaluation_metric": metric,
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
        },
    }


REF = example(reference_answer="the cat sat on the mat")


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        # unigram overlap: the x2, cat, on, mat = 5 of 6 each side -> P = R = F = 5/6
        ("rouge_1", 5 / 6),
        # bigrams: the-cat, on-the, the-mat shared = 3 of 5 each side
        ("rouge_2", 3 / 5),
        # trigrams: on-the-mat shared = 1 of 4
        ("rouge_3", 1 / 4),
        ("rouge_4", 0.0),
        # LCS: the cat on the mat = 5 of 6
        ("rouge_l", 5 / 6),
        # GLEU = min(P, R) over all 1-4 grams: matches 5 + 3 + 1 + 0 = 9 of 6 + 5 + 4 + 3 = 18
        ("gleu", 9 / 18),
        # Indel similarity: len 21 + 22 = 43, 20 characters in common -> 40 / 43
        ("fuzzy_match", 40 / 43),
    ],
)
def test_similarity_metrics_hand_computed(metric, expected):
    assert scores(similarity(metric), ["the cat is on the mat"], REF)[0] == pytest.approx(expected)


def test_bleu_hand_computed():
    # precisions 5/6, 3/5, 1/4, 0/3 -> sacrebleu's exp smoothing turns the 0 count into 1/(2*3);
    # brevity penalty 1 (same length). BLEU = exp(mean(log p_n))
    import math

    p = [5 / 6, 3 / 5, 1 / 4, (1 / 2) / 3]
    expected = math.exp(sum(math.log(x) for x in p) / 4)
    assert scores(similarity("bleu"), ["the cat is on the mat"], REF)[0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("metric", ["fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_5", "rouge_l"])
def test_similarity_identity_empty_and_unicode(metric):
    same, empty = scores(similarity(metric), ["the cat sat on the mat", ""], REF)
    assert same == pytest.approx(1.0, abs=0.01)  # METEOR's fragmentation penalty keeps it just under 1
    assert empty == 0.0
    assert scores(similarity(metric), [""], example(reference_answer=""))[0] == 1.0
    jp = scores(similarity(metric), ["猫 が マット に 座った"], example(reference_answer="猫 が マット に 座った"))[0]
    assert jp == pytest.approx(1.0, abs=0.07)


def test_meteor_uses_wordnet_synonyms():
    # "sitting" stems to "sit" which matches "sat" only through WordNet (sit/sat are one lemma)
    with_synonym = scores(similarity("meteor"), ["the cat was sitting on the mat"], REF)[0]
    assert 0.7 < with_synonym < 0.9
    assert scores(similarity("meteor"), ["dog runs fast"], REF)[0] == 0.0


def multi(formula, graders=None):
    graders = graders or {
        "exact": {
            "type": "string_check",
            "name": "exact",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "operation": "eq",
        },
        "fuzzy": {
            "type": "text_similarity",
            "name": "fuzzy",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "evaluation_metric": "fuzzy_match",
        },
    }
    return {
        "type": "openai_grader",
        "grader": {"type": "multi", "name": "m", "graders": graders, "calculate_output": formula},
    }


def test_multi_grader_formula_and_sub_scores():
    outcomes = score(multi("0.75 * exact + 0.25 * fuzzy ^ 2"), ["Paris", "Pari"], ITEM)
    assert outcomes[0].score == pytest.approx(1.0)
    # fuzzy("Pari", "Paris") = 2*4/9
    assert outcomes[1].score == pytest.approx(0.25 * (8 / 9) ** 2)
    assert outcomes[1].sub_scores == pytest.approx({"exact": 0.0, "fuzzy": 8 / 9})


def test_multi_formula_dividing_by_zero_is_a_runtime_error_not_a_zero():
    outcome = score(multi("fuzzy / exact"), ["Pari"], ITEM)[0]
    assert outcome.error_kind == "runtime_error"
    assert outcome.score is None
    assert "divides by zero" in outcome.error_message
    assert outcome.sub_scores == pytest.approx({"exact": 0.0, "fuzzy": 8 / 9})


def test_multi_formula_errors_are_found_before_the_job():
    with pytest.raises(SpecError, match=r"reward.function.grader.calculate_output: 'exact \+ nope' names nope"):
        score(multi("exact + nope"), ["x"], ITEM)
    with pytest.raises(SpecError, match="unknown function 'eval'"):
        score(multi("eval(exact)"), ["x"], ITEM)


def test_unknown_template_namespace_is_a_config_error():
    with pytest.raises(SpecError, match=r"grader.reference: uses \{\{reference_answer\}\}"):
        score(check("eq", reference="{{reference_answer}}"), ["x"], ITEM)


def test_cosine_is_refused_with_the_allowed_metrics():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="cosine needs an embeddings model"):
        score(similarity("cosine"), ["x"], ITEM)
