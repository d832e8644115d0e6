"""Write assets/prompts/agentic.jsonl: a repetitive, agent-like prompt set for suffix decoding.

An agent sends many requests of one shape: the same tool schema with other arguments, the same
database with another question, the same extraction format over another record. Their answers share
most of their tokens across requests, which is what suffix decoding's global tree (over earlier
requests' outputs) is for; prompt lookup sees only the request in hand. Three categories of 20
templated requests each, filled from small fixed lists (no randomness: the file is reproducible):

- `tool-call`: answer with one JSON function call for a fixed tool schema;
- `sql`: write one SQL query over a fixed two-table schema;
- `json-extract`: fill a fixed JSON record from a sentence.

Run: python -m scripts.make_agentic_prompts  (rewrites the file).
"""
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "agentic.jsonl"

TOOLS = ('Tools: get_weather(city: string, unit: "celsius" | "fahrenheit"), '
         'search_flights(origin: string, destination: string, date: string). '
         'Answer with exactly one JSON object {"tool": ..., "arguments": {...}} and nothing else.')
CITIES = ["Paris", "Lisbon", "Oslo", "Madrid", "Vienna", "Dublin", "Prague", "Berlin", "Rome", "Athens"]
DATES = ["2024-05-01", "2024-05-08", "2024-06-12", "2024-07-03", "2024-08-19"]

SCHEMA = ("Schema: customers(id, name, city, joined_at) and orders(id, customer_id, amount, status, created_at). "
          "Answer with one SQL query only.")
STATUSES = ["paid", "refunded", "pending", "shipped"]

RECORD = ('Extract a JSON object {"name": string, "city": string, "age": integer, "role": string} from the '
          "sentence. Answer with the JSON object only.")
PEOPLE = [("Ana Costa", "Lisbon", 34, "engineer"), ("Bo Lund", "Oslo", 41, "teacher"), ("Cai Wen", "Vienna", 29, "nurse"),
          ("Dee Park", "Dublin", 52, "pilot"), ("Eli Roth", "Prague", 23, "student"), ("Fay Moss", "Rome", 38, "chef"),
          ("Gil Ortiz", "Madrid", 45, "lawyer"), ("Hana Sato", "Berlin", 31, "designer"),
          ("Ivo Petrov", "Athens", 60, "farmer"), ("Jo Klein", "Paris", 27, "writer")]


def tool_calls() -> list[str]:
    asks = []
    for i, city in enumerate(CITIES):
        unit = "celsius" if i % 2 == 0 else "fahrenheit"
        asks.append(f"{TOOLS}\nUser: What is the weather in {city} right now, in {unit}?")
        dest = CITIES[(i + 3) % len(CITIES)]
        asks.append(f"{TOOLS}\nUser: Find me a flight from {city} to {dest} on {DATES[i % len(DATES)]}.")
    return asks


def sql_queries() -> list[str]:
    asks = []
    for i, city in enumerate(CITIES):
        status = STATUSES[i % len(STATUSES)]
        asks.append(f"{SCHEMA}\nQuestion: total amount of {status} orders per customer in {city}, largest first.")
        asks.append(f"{SCHEMA}\nQuestion: names of customers in {city} who joined after {DATES[i % len(DATES)]} "
                    f"and have at least one {status} order.")
    return asks


def extractions() -> list[str]:
    asks = []
    for name, city, age, role in PEOPLE:
        asks.append(f"{RECORD}\nSentence: {name}, a {age}-year-old {role}, lives in {city}.")
        asks.append(f"{RECORD}\nSentence: Living in {city} for years now, {role} {name} turned {age} last week.")
    return asks


def main() -> None:
    lines = []
    for category, asks in (("tool-call", tool_calls()), ("sql", sql_queries()), ("json-extract", extractions())):
        for n, prompt in enumerate(asks, 1):
            lines.append(json.dumps({"id": f"{category}-{n:02d}", "category": category, "prompt": prompt},
                                    ensure_ascii=False))
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} requests to {OUT}")


if __name__ == "__main__":
    main()
