// A pasted Megatron-LM launch script → the words bash would hand to torchrun, as far as flags go.
//
// NVIDIA's example scripts keep their flags in bash arrays and variables:
//
//     NUM_LAYERS=32
//     MODEL_ARGS=( --num-layers $NUM_LAYERS ... )
//     DTYPE_ARGS+=( "--fp8-format hybrid" )
//     torchrun ... ${MODEL_ARGS[@]} ${DTYPE_ARGS[@]}
//
// Reading the script's text in order, every array item stands where it was written (the arrays
// are expanded unquoted at the end, so an item's words are split: "--fp8-format hybrid" is two
// words), `$NAME`, `${NAME}` and `${NAME:-default}` expand, and an assignment is remembered for
// what follows. Both branches of an `if` are read; a later flag wins, as Megatron's argparse
// would have it. What cannot be known (`$(...)`, an unset variable) stays as written, so an error
// can name it.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"

namespace autopar {
namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The length of NAME in `NAME=...` or `NAME+=...` at the start of `text` (0 if it is not one).
size_t AssignedNameLength(const std::string& text) {
  if (text.empty() || !IsNameStart(text[0])) return 0;
  size_t n = 1;
  while (n < text.size() && IsNameChar(text[n])) ++n;
  if (text.compare(n, 1, "=") == 0) return n;
  return text.compare(n, 2, "+=") == 0 ? n : 0;
}

// `NAME=` or `NAME+=`, all of `text`: an array's items follow its `(`.
bool IsArrayStart(const std::string& text) {
  const size_t n = AssignedNameLength(text);
  return n > 0 && text.back() == '=' && text.size() <= n + 2;
}

// The end of the expansion at text[from] (a `$`): `${...}` to its closing brace, `$NAME`, `$1`;
// anything else (`$(`, `$$`) is a lone `$`.
size_t ExpansionEnd(const std::string& text, size_t from) {
  size_t end = from + 1;
  if (end < text.size() && text[end] == '{') {
    for (int depth = 0; end < text.size(); ++end) {
      if (text[end] == '{') ++depth;
      if (text[end] == '}' && --depth == 0) return end + 1;
    }
    throw InputError("megatron args", "unterminated ${ in '" + text.substr(from, 40) + "'");
  }
  if (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) return end + 1;
  while (end < text.size() && IsNameChar(text[end])) ++end;
  return end;
}

class ScriptReader {
 public:
  ScriptReader(const std::string& text, const ShellVariables& variables)
      : text_(text), variables_(variables) {}

  std::vector<std::string> Words() {
    while (pos_ < text_.size()) Step();
    EndWord();
    return std::move(words_);
  }

 private:
  // A word is built from pieces: literal or quoted text (kept whole) and unquoted expansions
  // (split on blanks when the word ends, as bash splits an unquoted expansion into fields). Every
  // piece of an array item is split: the arrays are expanded unquoted.
  struct Piece {
    std::string text;
    bool split;
  };

  void Step() {
    const char c = text_[pos_];
    if (c == '\\') {
      if (text_.compare(pos_, 2, "\\\n") == 0) {
        pos_ += 2;  // line continuation
      } else if (text_.compare(pos_, 3, "\\\r\n") == 0) {
        pos_ += 3;
      } else {
        if (pos_ + 1 < text_.size()) Add(std::string(1, text_[pos_ + 1]), in_array_);
        pos_ += 2;
      }
    } else if (c == '\'' || c == '"') {
      size_t close = pos_ + 1;
      while (close < text_.size() && text_[close] != c) {
        close += c == '"' && text_[close] == '\\' ? 2 : 1;
      }
      if (close >= text_.size()) {
        throw InputError("megatron args", std::string("unterminated ") + c + " quote");
      }
      const std::string inside = text_.substr(pos_ + 1, close - pos_ - 1);
      Add(c == '"' ? Expand(inside) : inside, in_array_);
      quoted_ = true;
      pos_ = close + 1;
    } else if (c == '$') {
      const size_t end = ExpansionEnd(text_, pos_);
      Add(Expand(text_.substr(pos_, end - pos_)), true);
      pos_ = end;
    } else if (IsBlank(c)) {
      EndWord();
      ++pos_;
    } else if (c == '#' && pieces_.empty()) {
      const size_t end = text_.find('\n', pos_);  // a comment runs to the end of the line
      pos_ = end == std::string::npos ? text_.size() : end;
    } else if (c == '(' && !in_array_ && pieces_.size() == 1 && !quoted_ &&
               IsArrayStart(pieces_[0].text)) {
      words_.push_back(pieces_[0].text + "(");  // NAME=( ...: the items follow, each a word
      pieces_.clear();
      in_array_ = true;
      ++pos_;
    } else if (c == ')' && in_array_) {
      EndWord();
      in_array_ = false;
      ++pos_;
    } else {
      Add(std::string(1, c), in_array_);
      ++pos_;
    }
  }

  void Add(const std::string& text, bool split) {
    if (!pieces_.empty() && pieces_.back().split == split) {
      pieces_.back().text += text;
    } else {
      pieces_.push_back({text, split});
    }
  }

  // The value of NAME: --megatron-env first, then what the script assigned, then the
  // environment the tool runs in. nullptr when unset.
  const std::string* Lookup(const std::string& name) const {
    for (const auto* map : {&variables_.overrides, &assigned_, &variables_.environment}) {
      if (const auto it = map->find(name); it != map->end()) return &it->second;
    }
    return nullptr;
  }

  // Expands every `$...` of `text` (the inside of double quotes, or one unquoted expansion).
  std::string Expand(const std::string& text) const {
    std::string out;
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 2, "\\\n") == 0) {
        i += 2;  // a line continuation inside double quotes
      } else if (text[i] == '\\' && i + 1 < text.size() &&
                 std::string("$\"\\`").find(text[i + 1]) != std::string::npos) {
        out += text[i + 1];
        i += 2;
      } else if (text[i] == '$') {
        const size_t end = ExpansionEnd(text, i);
        out += ExpandOne(text.substr(i, end - i));
        i = end;
      } else {
        out += text[i++];
      }
    }
    return out;
  }

  // One `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME-word}`, `${NAME:=word}`; anything else
  // (`${#NAME}`, `${NAME[@]}`, an unset NAME) as written, so an error can show it.
  std::string ExpandOne(const std::string& expansion) const {
    const bool braced = expansion.size() > 2 && expansion[1] == '{';
    const std::string body =
        braced ? expansion.substr(2, expansion.size() - 3) : expansion.substr(1);
    size_t n = 0;
    if (!body.empty() && std::isdigit(static_cast<unsigned char>(body[0]))) {
      n = 1;
    } else {
      while (n < body.size() && IsNameChar(body[n])) ++n;
    }
    if (n == 0) return expansion;
    const std::string* value = Lookup(body.substr(0, n));
    const std::string rest = body.substr(n);
    if (rest.empty()) return value != nullptr ? *value : expansion;
    for (const std::string op : {":-", ":=", "-", "="}) {
      if (!braced || rest.compare(0, op.size(), op) != 0) continue;
      if (value != nullptr && !(op[0] == ':' && value->empty())) return *value;
      return Unquote(rest.substr(op.size()));
    }
    return expansion;
  }

  // The `word` of ${NAME:-word}: its quotes removed, its expansions expanded.
  std::string Unquote(const std::string& word) const {
    std::string out;
    for (size_t i = 0; i < word.size();) {
      if (word[i] == '\'' || word[i] == '"') {
        const size_t close = std::min(word.find(word[i], i + 1), word.size());
        const std::string inside = word.substr(i + 1, close - i - 1);
        out += word[i] == '"' ? Expand(inside) : inside;
        i = close + 1;
      } else {
        const size_t next = std::min(word.find_first_of("'\"", i), word.size());
        out += Expand(word.substr(i, next - i));
        i = next;
      }
    }
    return out;
  }

  // The word read so far: an assignment (outside an array) is remembered, and its fields are
  // the words.
  void EndWord() {
    if (pieces_.empty() && !quoted_) return;
    std::vector<Piece> pieces = std::move(pieces_);
    pieces_.clear();
    const bool quoted = quoted_;
    quoted_ = false;
    const size_t name = pieces.empty() || pieces[0].split ? 0 : AssignedNameLength(pieces[0].text);
    if (!in_array_ && name > 0) {
      Assign(pieces, name);
      return;
    }
    EmitFields(pieces, quoted);
  }

  // NAME=value or NAME+=value, remembered for later expansions. A value with blanks
  // (GPT_ARGS="--num-layers 32 ...") also yields its words, for a script that expands it where
  // this reader cannot see.
  void Assign(const std::vector<Piece>& pieces, size_t name_length) {
    std::string whole;
    for (const Piece& p : pieces) whole += p.text;
    const bool append = whole[name_length] == '+';
    const size_t eq = name_length + (append ? 1 : 0);
    const std::string name = whole.substr(0, name_length), value = whole.substr(eq + 1);
    assigned_[name] = append ? assigned_[name] + value : value;
    if (std::none_of(value.begin(), value.end(), IsBlank)) {
      words_.push_back(whole);
      return;
    }
    words_.push_back(whole.substr(0, eq + 1));
    EmitFields({{value, true}}, false);
  }

  // The fields of a word: split pieces break at blanks; a quoted empty string is still a word.
  void EmitFields(const std::vector<Piece>& pieces, bool quoted) {
    std::string word;
    bool in_word = quoted;
    for (const Piece& p : pieces) {
      for (char c : p.text) {
        if (p.split && IsBlank(c)) {
          if (in_word) words_.push_back(word);
          word.clear();
          in_word = false;
        } else {
          word += c;
          in_word = true;
        }
      }
    }
    if (in_word) words_.push_back(word);
  }

  const std::string& text_;
  const ShellVariables& variables_;
  std::map<std::string, std::string> assigned_;  // the script's assignments so far
  size_t pos_ = 0;
  bool in_array_ = false;
  bool quoted_ = false;  // the word has a quoted part (so "" is a word)
  std::vector<Piece> pieces_;
  std::vector<std::string> words_;
};

}  // namespace

std::vector<std::string> SplitCommandLine(const std::string& text,
                                          const ShellVariables& variables) {
  return ScriptReader(text, variables).Words();
}

}  // namespace autopar
