"""Structured output over HTTP: every reply parses and validates against its schema (jsonschema)."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from conftest_helpers import MODEL

S = {"type": "string", "maxLength": 24}
SCHEMAS = {
    "person": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
               "required": ["name", "age"], "additionalProperties": False},
    "string-enum": {"enum": ["red", "green", "blue"]},
    "bounded-integer": {"type": "integer", "minimum": 1, "maximum": 10},
    "boolean": {"type": "boolean"},
    # a bare number at the root lets greedy decoding repeat decimals until max_tokens: two digits at most
    "number": {"type": "number", "minimum": 0, "maximum": 1000, "multipleOf": 0.01},
    "number-in-object": {"type": "object", "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 60}},
                         "required": ["celsius"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "title": S, "author": {"type": "object", "properties": {"first": S, "last": S},
                               "required": ["first", "last"], "additionalProperties": False}},
        "required": ["title", "author"], "additionalProperties": False},
    "string-array": {"type": "array", "items": S, "minItems": 1, "maxItems": 4},
    "array-of-objects": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"], "additionalProperties": False}},
    "any-of": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "string", "maxLength": 10}]},
    "nullable": {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 20}},
                 "required": ["note"], "additionalProperties": False},
    "const": {"type": "object", "properties": {"version": {"const": 2}, "ok": {"type": "boolean"}},
              "required": ["version", "ok"], "additionalProperties": False},
    "defs-and-ref": {"$defs": {"point": {"type": "object", "properties": {"lat": {"type": "number"},
                                                                         "lon": {"type": "number"}},
                                         "required": ["lat", "lon"], "additionalProperties": False}},
                     "type": "object", "properties": {"start": {"$ref": "#/$defs/point"},
                                                      "end": {"$ref": "#/$defs/point"}},
                     "required": ["start", "end"], "additionalProperties": False},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
                "required": ["code"], "additionalProperties": False},
    "optional-properties": {"type": "object", "properties": {"a": {"type": "integer"}, "b": S, "c": {"type": "boolean"}},
                            "required": ["a"], "additionalProperties": False},
    "enum-array": {"type": "array", "items": {"enum": ["low", "mid", "high"]}, "minItems": 2, "maxItems": 3},
    "tuple": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 12}, {"type": "integer"},
                                               {"type": "boolean"}], "items": False, "minItems": 3},
    "numeric-enum": {"type": "object", "properties": {"level": {"enum": [1, 2, 3, 5, 8]}},
                     "required": ["level"], "additionalProperties": False},
    "deep": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "integer"}}, "required": ["c"], "additionalProperties": False}}, "required": ["b"],
        "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    "one-of-objects": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer", "maximum": 9}},
         "required": ["kind", "lives"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "dog"}, "breed": S},
         "required": ["kind", "breed"], "additionalProperties": False}]},
    "short-strings": {"type": "object", "properties": {"city": {"type": "string", "minLength": 2, "maxLength": 12},
                                                       "country": {"type": "string", "minLength": 2, "maxLength": 12}},
                      "required": ["city", "country"], "additionalProperties": False},
}


def test_twenty_schemas_of_varied_shape():
    assert len(SCHEMAS) >= 20
    for schema in SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_output_parses_and_validates(client, name):
    schema = SCHEMAS[name]
    reply = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=160,
        messages=[{"role": "user", "content": f"Answer in JSON. Give an example of a {name.replace('-', ' ')}."}],
        response_format={"type": "json_schema", "json_schema": {"name": name.replace("-", "_"), "schema": schema,
                                                                "strict": True}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    value = json.loads(choice.message.content)
    jsonschema.validate(value, schema)


def test_json_object_parses_and_streams_the_same(client):
    messages = [{"role": "user", "content": "Describe a cat as JSON."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=120,
                                           response_format={"type": "json_object"})
    assert whole.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(whole.choices[0].message.content), dict)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=120, stream=True,
        response_format={"type": "json_object"}) if c.choices)
    assert streamed == whole.choices[0].message.content


def test_sampled_structured_output_is_valid_too(client):
    schema = SCHEMAS["person"]
    for seed in (1, 2, 3):
        reply = client.chat.completions.create(
            model=MODEL, temperature=1.0, seed=seed, max_tokens=80,
            messages=[{"role": "user", "content": "A person, as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_completions_take_response_format_too(client):
    reply = client.completions.create(model=MODEL, prompt="A list of three numbers:", max_tokens=40, temperature=0,
                                      extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                          "name": "n", "schema": {"type": "array", "items": {"type": "integer"},
                                                                  "minItems": 3, "maxItems": 3}}}})
    value = json.loads(reply.choices[0].text)
    assert len(value) == 3 and all(isinstance(v, int) for v in value)


def test_a_schema_the_grammar_cannot_take_is_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "wibble"}}})
    assert caught.value.body["param"] == "response_format"


def test_structured_output_on_the_engine_directly(default_engine):
    """The constraint through the engine's public API, with the whitespace pinned to compact JSON."""
    from engine.constraints import ConstraintFactory
    from engine.engine import Finished
    from engine.sampling import SamplingParams

    factory = ConstraintFactory.for_tokenizer(default_engine.tokenizer(MODEL))
    assert ConstraintFactory.for_tokenizer(default_engine.tokenizer(MODEL)) is factory   # built once per model
    tokens = default_engine.conversation_tokens(MODEL, [{"role": "user", "content": "Pick a colour."}])
    events = default_engine.generate_tokens(MODEL, tokens, SamplingParams(temperature=0, max_tokens=20),
                                            constraint=factory.json_schema(SCHEMAS["string-enum"]))
    finished = [e for e in events if isinstance(e, Finished)][0]
    assert json.loads(finished.text) in ("red", "green", "blue")
    assert finished.stats.stop_reason == "eos"


def test_the_grammar_mask_as_device_sampler_words(default_engine):
    """What cuda-native's sampler receives (uint32 words, a bit per token) is the mask the host sampler
    applies: the grammar's own words equal its bool mask packed, for a vocabulary that is not a multiple
    of 32 too; where nothing the grammar allows is left, only end of sequence."""
    import numpy as np

    from engine.constraints import ConstraintFactory
    from engine.sampling import mask_words

    factory = ConstraintFactory.for_tokenizer(default_engine.tokenizer(MODEL))
    constraint = factory.json_schema(SCHEMAS["string-enum"])

    class BoolMaskOnly:                      # a constraint that gives only the bool mask
        def allowed_mask(self, vocab_size):
            return constraint.allowed_mask(vocab_size)

    for vocab in (49152, 49152 - 7):
        words = mask_words(constraint, vocab)
        assert words.dtype == np.uint32 and words.shape == (-(-vocab // 32),)
        np.testing.assert_array_equal(words, mask_words(BoolMaskOnly(), vocab))
        unpacked = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
        assert not unpacked[vocab:].any() and unpacked[:vocab].sum() == int(constraint.allowed_mask(vocab).sum()) > 0
    for vocab in (40, 17):                   # rows cut short: what the grammar allows among them, else eos
        tiny = mask_words(constraint, vocab)
        allowed = set(np.flatnonzero(np.unpackbits(tiny.view(np.uint8), bitorder="little")[:vocab]).tolist())
        among = set(np.flatnonzero(constraint.allowed_mask(49152).numpy()[:vocab]).tolist())
        assert allowed == (among or {e for e in constraint.eos_ids if e < vocab})
