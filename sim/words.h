// sim/words: the fixed word list of the pseudo-text. The stand-in tokenizer gives each word a
// token of its own (with and without a leading space), the way a real BPE vocabulary holds common
// words, so generated text re-tokenizes to exactly the ids that were generated.
#pragma once

#include <array>
#include <string_view>

namespace kvgate::sim {

// Lowercase ASCII letters only, no duplicates (checked by the tokenizer's unit tests).
inline constexpr std::array<std::string_view, 256> kWords = {
    "the",      "of",       "and",    "to",         "in",      "is",     "that",    "for",
    "it",       "as",       "was",    "with",       "be",      "by",     "on",      "not",
    "he",       "this",     "are",    "or",         "his",     "from",   "at",      "which",
    "but",      "have",     "an",     "had",        "they",    "you",    "were",    "their",
    "one",      "all",      "we",     "can",        "her",     "has",    "there",   "been",
    "if",       "more",     "when",   "will",       "would",   "who",    "so",      "no",
    "she",      "other",    "its",    "may",        "these",   "about",  "than",    "them",
    "time",     "only",     "new",    "some",       "could",   "into",   "two",     "then",
    "do",       "first",    "any",    "like",       "my",      "now",    "over",    "such",
    "our",      "man",      "me",     "even",       "most",    "made",   "after",   "also",
    "did",      "many",     "before", "must",       "through", "back",   "years",   "where",
    "much",     "your",     "way",    "well",       "down",    "should", "because", "each",
    "just",     "those",    "people", "how",        "too",     "little", "state",   "good",
    "very",     "make",     "world",  "still",      "own",     "see",    "men",     "work",
    "long",     "get",      "here",   "between",    "both",    "life",   "being",   "under",
    "never",    "day",      "same",   "another",    "know",    "while",  "last",    "might",
    "us",       "great",    "old",    "year",       "off",     "come",   "since",   "against",
    "go",       "came",     "right",  "used",       "take",    "three",  "small",   "large",
    "system",   "cache",    "token",  "model",      "request", "server", "memory",  "batch",
    "prefix",   "block",    "page",   "queue",      "stream",  "router", "gateway", "engine",
    "river",    "mountain", "city",   "garden",     "window",  "music",  "light",   "water",
    "stone",    "forest",   "ocean",  "bridge",     "market",  "story",  "paper",   "field",
    "simple",   "quiet",    "bright", "early",      "late",    "open",   "close",   "clear",
    "quick",    "slow",     "warm",   "cold",       "young",   "whole",  "certain", "public",
    "number",   "part",     "place",  "case",       "point",   "group",  "problem", "fact",
    "hand",     "house",    "letter", "night",      "word",    "home",   "country", "school",
    "question", "answer",   "reason", "result",     "change",  "order",  "power",   "value",
    "line",     "side",     "kind",   "head",       "face",    "voice",  "idea",    "body",
    "read",     "write",    "build",  "send",       "find",    "keep",   "give",    "tell",
    "become",   "leave",    "feel",   "bring",      "begin",   "show",   "hear",    "play",
    "run",      "move",     "live",   "believe",    "hold",    "happen", "include", "continue",
    "set",      "learn",    "lead",   "understand", "watch",   "follow", "stop",    "create",
};

}  // namespace kvgate::sim
