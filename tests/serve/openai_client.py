"""The official OpenAI client against a running `serve` (tests/serve_openai.rs).

Usage: openai_client.py BASE_URL API_KEY CLIP.wav
Exits non-zero (with a traceback) on the first failed check.
"""
import base64
import json
import sys

import openai

base, key, clip = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)

models = [m.id for m in client.models.list().data]
assert len(models) == 4, models
llm = models[0]

# Chat, not streamed.
chat = client.chat.completions.create(
    model=llm,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    temperature=0,
    max_tokens=20,
)
assert chat.choices[0].message.content == "The capital of France is Paris.", chat
assert chat.choices[0].finish_reason == "stop", chat
assert chat.usage.completion_tokens == 7 and chat.usage.prompt_tokens > 0, chat.usage

# Chat, streamed, with usage at the end: the same text.
pieces, finish, usage = [], None, None
for chunk in client.chat.completions.create(
    model=llm,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    temperature=0,
    max_tokens=20,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        pieces.append(c.delta.content or "")
        finish = c.finish_reason or finish
assert "".join(pieces) == "The capital of France is Paris.", pieces
assert finish == "stop" and usage.completion_tokens == 7, (finish, usage)

# Multi-turn with a system message; a length stop.
chat = client.chat.completions.create(
    model=llm,
    messages=[
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
    ],
    temperature=0,
    max_completion_tokens=8,
)
assert chat.choices[0].message.content.strip(), chat
assert chat.usage.completion_tokens <= 8, chat.usage
chat = client.chat.completions.create(
    model=llm,
    messages=[{"role": "user", "content": "Tell me about Paris."}],
    temperature=0,
    max_completion_tokens=3,
)
assert chat.choices[0].finish_reason == "length", chat
assert chat.usage.completion_tokens == 3, chat.usage

# Log probabilities: the greedy token is the most likely one.
chat = client.chat.completions.create(
    model=llm,
    messages=[{"role": "user", "content": "Say hello."}],
    temperature=0,
    max_tokens=4,
    logprobs=True,
    top_logprobs=3,
)
content = chat.choices[0].logprobs.content
assert len(content) == chat.usage.completion_tokens, content
for t in content:
    assert len(t.top_logprobs) == 3, t
    assert t.logprob <= 0 and abs(t.logprob - t.top_logprobs[0].logprob) < 1e-4, t

# Seeded sampling repeats itself.
def sampled(seed):
    return client.completions.create(
        model=llm, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=seed
    ).choices[0].text

assert sampled(7) == sampled(7)

# JSON-schema output parses and fits the schema.
schema = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
chat = client.chat.completions.create(
    model=llm,
    messages=[{"role": "user", "content": "Where is the Eiffel tower? Answer in JSON."}],
    temperature=0,
    max_tokens=60,
    response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
)
place = json.loads(chat.choices[0].message.content)
assert set(place) == {"city", "country"}, place

# Text completions, streamed.
text = "".join(
    c.choices[0].text
    for c in client.completions.create(
        model=llm, prompt="1, 2, 3,", max_tokens=8, temperature=0, stream=True
    )
    if c.choices
)
assert text.startswith(" 4"), text

# Stop strings.
done = client.completions.create(model=llm, prompt="1, 2, 3,", max_tokens=16, temperature=0, stop=[" 6"])
assert done.choices[0].finish_reason == "stop" and " 6" not in done.choices[0].text, done

# Errors arrive as the client's exceptions.
try:
    client.chat.completions.create(model=llm, messages=[], max_tokens=4)
    raise AssertionError("empty messages were accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400, e
try:
    openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e

# Embeddings: unit vectors of the model's dimension, in input order.
emb = client.embeddings.create(model=models[1], input=["A man is eating food.", "A man rides a horse."])
assert [d.index for d in emb.data] == [0, 1]
assert all(len(d.embedding) == 384 for d in emb.data)
norm = sum(x * x for x in emb.data[0].embedding) ** 0.5
assert abs(norm - 1) < 1e-4, norm
assert emb.usage.prompt_tokens > 0
b64 = client.embeddings.create(model=models[1], input="hello", encoding_format="base64")
raw = base64.b64decode(b64.data[0].embedding)
assert len(raw) == 384 * 4, len(raw)

# Transcription of a LibriVox clip, then speech round trip.
with open(clip, "rb") as f:
    t = client.audio.transcriptions.create(model=models[2], file=f)
assert "amiable" in t.text, t.text
with open(clip, "rb") as f:
    srt = client.audio.transcriptions.create(model=models[2], file=f, response_format="srt")
assert "-->" in srt, srt
with open(clip, "rb") as f:
    v = client.audio.transcriptions.create(model=models[2], file=f, response_format="verbose_json")
assert v.segments and v.duration > 1, v
speech = client.audio.speech.create(model=models[3], voice="default", input="Hello from the server.", response_format="wav")
wav = speech.read()
assert wav[:4] == b"RIFF" and len(wav) > 20000, len(wav)
print("openai client: all checks passed")
