"""Diverse chat prompts for distilling the chat draft (templates x hand-written topics).

`train_prompts(n, seed)` draws from the training topics; `heldout_prompts(n, seed)`
draws from a disjoint list of held-out topics (used only for evaluation).
Prompts are plain user messages; apply the tokenizer's chat template yourself.
"""
from __future__ import annotations

import random

TOPICS = {
    "science": [
        "photosynthesis", "gravity", "black holes", "the water cycle", "DNA", "evolution", "volcanoes",
        "earthquakes", "the periodic table", "electricity", "magnetism", "the speed of light", "atoms",
        "climate change", "the immune system", "vaccines", "plate tectonics", "the solar system", "the Moon",
        "rainbows", "sound waves", "friction", "chemical reactions", "acids and bases", "the greenhouse effect",
        "stars", "galaxies", "bacteria", "viruses", "cells", "the human brain", "ocean tides", "weather",
        "clouds", "renewable energy", "solar panels", "nuclear energy", "batteries", "magnets", "genetics",
        "dinosaurs", "fossils", "the Big Bang", "entropy", "relativity", "quantum mechanics", "lightning",
        "the heart", "bees", "coral reefs", "rain forests", "deserts", "glaciers", "the ozone layer",
    ],
    "cooking": [
        "baking bread", "making pasta from scratch", "cooking rice", "a vegetable soup", "pancakes",
        "a chocolate cake", "grilling vegetables", "making a salad", "boiling eggs", "a stir fry",
        "making pizza dough", "roasting a chicken", "homemade tomato sauce", "cooking lentils", "smoothies",
        "chopping onions", "seasoning with herbs", "fermenting vegetables", "making coffee", "brewing tea",
        "a healthy breakfast", "meal prepping", "baking cookies", "making yogurt", "cooking fish",
        "vegetarian meals", "spices", "sourdough starter", "knife skills", "storing leftovers",
    ],
    "history": [
        "the Roman Empire", "ancient Egypt", "the pyramids", "the French Revolution", "the Industrial Revolution",
        "the printing press", "World War I", "World War II", "the Renaissance", "the Silk Road",
        "the Cold War", "the moon landing", "ancient Greece", "the Vikings", "the Middle Ages",
        "the invention of the telephone", "the Great Wall of China", "the Maya civilization", "the Olympic Games",
        "the history of money", "the invention of writing", "the Ottoman Empire", "the age of exploration",
        "the history of the internet", "the steam engine", "the abolition of slavery", "the Wright brothers",
    ],
    "programming": [
        "Python lists", "recursion", "variables", "loops", "functions", "object-oriented programming",
        "sorting algorithms", "binary search", "hash tables", "Git", "version control", "unit testing",
        "debugging", "APIs", "databases", "SQL queries", "JavaScript", "HTML", "CSS", "web servers",
        "linked lists", "stacks and queues", "big O notation", "regular expressions", "machine learning",
        "neural networks", "cloud computing", "cybersecurity", "passwords", "open source software",
        "the command line", "JSON", "exceptions in Python", "dictionaries in Python", "compilers",
        "operating systems", "multithreading", "code reviews", "clean code", "Linux",
    ],
    "travel": [
        "visiting Paris", "a trip to Japan", "packing a suitcase", "traveling on a budget", "backpacking in Europe",
        "camping", "hiking in the mountains", "a road trip", "travel insurance", "jet lag",
        "learning a few words of a new language",
        "visiting a museum", "booking flights", "traveling with children", "a beach holiday", "train travel",
        "visiting Italy", "exploring a new city", "staying in hostels", "traveling alone", "Iceland",
        "the Grand Canyon", "a safari in Kenya", "New York City", "visiting London",
    ],
    "health": [
        "sleep", "drinking water", "regular exercise", "stretching", "stress", "meditation", "a balanced diet",
        "vitamins", "running", "yoga", "posture", "a cold", "the flu", "washing hands", "sun protection",
        "mental health", "walking every day", "healthy snacks", "screen time", "caffeine", "protein",
        "strength training", "breathing exercises", "dental care", "back pain", "headaches",
    ],
    "everyday": [
        "saving money", "making a budget", "cleaning the kitchen", "organizing a closet", "time management",
        "learning a new skill", "writing a resume", "a job interview", "making friends", "gardening",
        "growing tomatoes", "caring for a dog", "caring for a cat", "houseplants", "recycling", "moving house",
        "planning a birthday party", "public speaking", "writing an email", "reading more books", "procrastination",
        "staying motivated", "learning to drive", "doing laundry", "fixing a flat tire", "being a good listener",
        "setting goals", "waking up early", "working from home", "studying for exams", "taking notes",
        "saying no politely", "giving a gift", "a rainy day", "the weekend", "teamwork",
    ],
    "maths": [
        "fractions", "percentages", "prime numbers", "the Pythagorean theorem", "probability", "statistics",
        "algebra", "equations", "geometry", "circles", "pi", "multiplication", "long division", "negative numbers",
        "square roots", "exponents", "logarithms", "calculus", "derivatives", "averages", "graphs", "triangles",
        "the Fibonacci sequence", "infinity", "binary numbers", "compound interest", "ratios",
    ],
    "arts": [
        "music", "the piano", "learning guitar", "painting", "photography", "poetry", "jazz", "classical music",
        "Shakespeare", "novels", "drawing", "film making", "dance", "sculpture", "architecture", "comics",
    ],
    "nature": [
        "the ocean", "autumn", "winter", "spring", "summer", "a forest", "rivers", "mountains", "the night sky",
        "birds", "whales", "elephants", "wolves", "butterflies", "trees", "flowers", "the wind", "snow", "the sunrise",
    ],
}

HELDOUT_TOPICS = {
    "science": ["comets", "the nitrogen cycle", "tsunamis", "the human skeleton", "static electricity", "mushrooms and fungi"],
    "cooking": ["making soup stock", "baking muffins", "cooking beans", "making omelettes", "roasting vegetables"],
    "history": ["the Aztec empire", "the invention of the light bulb", "the Black Death", "ancient China"],
    "programming": ["sets in Python", "trees in computer science", "HTTP", "type systems", "caching"],
    "travel": ["visiting Spain", "a cruise", "traveling by bus", "visiting Canada", "a city break"],
    "health": ["hearing protection", "cycling to work", "eating fruit", "cold showers"],
    "everyday": ["writing a thank-you note", "keeping a journal", "buying a used car", "cooking on a budget", "painting a room"],
    "maths": ["matrices", "symmetry", "decimals", "the area of a rectangle", "rounding numbers"],
    "arts": ["opera", "pottery", "the violin"],
    "nature": ["owls", "thunderstorms", "lakes", "penguins"],
}

TEMPLATES = [
    "Explain {t} in simple terms.",
    "Can you explain {t} to a beginner?",
    "Describe {t}.",
    "What is {t}?",
    "Tell me about {t}.",
    "Write a short poem about {t}.",
    "Write a haiku about {t}.",
    "List three interesting facts about {t}.",
    "List five tips about {t}.",
    "Give me some advice about {t}.",
    "Summarise the key ideas of {t} in a few sentences.",
    "Why is {t} important?",
    "Write a short paragraph about {t}.",
    "What are the pros and cons of {t}?",
    "Explain {t} to a ten-year-old.",
    "What should everyone know about {t}?",
    "Write a short story involving {t}.",
    "Give a one-sentence definition of {t}.",
    "What are common mistakes people make with {t}?",
    "How would you teach {t} to a friend?",
    "Write a short blog introduction about {t}.",
    "What questions do people often ask about {t}?",
    "Give me a fun fact about {t}.",
    "Describe {t} in three sentences.",
]
HOWTO = [
    "How do I get started with {t}?",
    "How can I get better at {t}?",
    "What is the best way to learn about {t}?",
    "Give me a step-by-step guide to {t}.",
]
COMPARE = [
    "Compare {a} and {b}.",
    "What is the difference between {a} and {b}?",
    "How are {a} and {b} related?",
]
MISC = [
    "Hi! How are you today?", "What can you help me with?", "Tell me a joke.", "Give me a motivational quote.",
    "What is the capital of France?", "What is 12 times 7?", "Translate 'good morning' into Spanish.",
    "Suggest a name for a pet goldfish.", "What is a good book to read this summer?", "Write a limerick about a cat.",
    "What day comes after Monday?", "Give me three ideas for a weekend.", "How many continents are there?",
    "Write a thank-you message to a teacher.", "What is the boiling point of water?", "Tell me something interesting.",
    "Recommend a hobby for someone who likes being outdoors.", "Write a short apology for being late.",
    "What is the largest planet in the solar system?", "Who wrote Romeo and Juliet?",
    "Write a Python function that reverses a string.", "Write a Python function to check if a number is prime.",
    "How do I sort a list in Python?", "What is 15% of 80?", "Solve for x: 2x + 3 = 11.",
]


def _gen(topics: dict, n: int, seed: int, misc: bool) -> list[str]:
    rng = random.Random(seed)
    flat = [t for ts in topics.values() for t in ts]
    by_cat = list(topics.values())
    out = []
    while len(out) < n:
        r = rng.random()
        if misc and r < 0.04:
            out.append(rng.choice(MISC))
        elif r < 0.12:
            ts = rng.choice(by_cat)
            a, b = rng.sample(ts, 2)
            out.append(rng.choice(COMPARE).format(a=a, b=b))
        elif r < 0.25:
            out.append(rng.choice(HOWTO).format(t=rng.choice(flat)))
        else:
            out.append(rng.choice(TEMPLATES).format(t=rng.choice(flat)))
    return out


def train_prompts(n: int, seed: int = 0) -> list[str]:
    return _gen(TOPICS, n, seed, misc=True)


def heldout_prompts(n: int, seed: int = 12345) -> list[str]:
    return _gen(HELDOUT_TOPICS, n, seed, misc=False)


def chat_ids(tok, prompt: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


if __name__ == "__main__":
    n_topics = sum(len(v) for v in TOPICS.values())
    print("train topics", n_topics, "heldout topics", sum(len(v) for v in HELDOUT_TOPICS.values()))
    for p in train_prompts(8):
        print(" ", p)
    for p in heldout_prompts(4):
        print(" H", p)
