#include "autopar/cli/help.h"

#include <cstdio>
#include <string>
#include <vector>

#include "autopar/version.h"

namespace autopar::cli {
namespace {

constexpr size_t kWidth = 100;       // docs/style.md §1's columns
const std::string kIndent(33, ' ');  // where a flag's meaning starts

// `text` in lines of at most kWidth columns after kIndent, the later lines indented by it.
std::string Wrap(const std::string& text) {
  std::string wrapped, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && kIndent.size() + line.size() + 1 + word.size() > kWidth) {
      wrapped += line + "\n" + kIndent;
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  return wrapped + line;
}

void WriteGroup(std::ostream& out, const FlagGroup& g) {
  out << "\n" << g.title << ":\n";
  if (g.compact) {
    std::string line = " ";
    for (const FlagHelp& f : g.flags) {
      std::string item = std::string(" ") + f.flag + (*f.value ? std::string(" ") + f.value : "");
      if (line.size() + item.size() > kWidth) {
        out << line << "\n";
        line = " ";
      }
      line += item;
    }
    out << line << "\n";
    return;
  }
  for (const FlagHelp& f : g.flags) {
    const std::string left = std::string(f.flag) + (*f.value ? std::string(" ") + f.value : "");
    char head[64];
    std::snprintf(head, sizeof head, "  %-30s ", left.c_str());
    out << (left.size() <= 30 ? std::string(head) : "  " + left + "\n" + kIndent);
    out << Wrap(f.meaning) << "\n";
  }
}

// `tokens` joined by spaces in lines of at most kWidth columns, the later lines indented by
// `indent`; a token longer than a line stands alone.
std::string WrapTokens(const std::vector<std::string>& tokens, const std::string& indent) {
  std::string text, line;
  for (const std::string& token : tokens) {
    if (!line.empty() && line.size() + 1 + token.size() > kWidth) {
      text += line + "\n";
      line = indent;
    }
    line += (line.empty() || line == indent ? "" : " ") + token;
  }
  return text + line + "\n";
}

std::string Item(const FlagHelp& f) {
  return std::string("`") + f.flag + (*f.value ? std::string(" ") + f.value : "") + "`";
}

}  // namespace

std::string FlagReferenceMarkdown() {
  // Each group once (two with the same title and flags are one), with the commands that take it.
  struct Entry {
    std::string title;
    std::vector<std::string> items, commands;
  };
  std::vector<Entry> entries;
  for (const CommandHelp& c : AllCommands()) {
    for (const FlagGroup* g : c.groups) {
      std::vector<std::string> items;
      for (const FlagHelp& f : g->flags) items.push_back(Item(f));
      bool merged = false;
      for (Entry& e : entries) {
        if (e.title == g->title && e.items == items) {
          e.commands.push_back(c.name);
          merged = true;
        }
      }
      if (!merged) entries.push_back({g->title, items, {c.name}});
    }
  }
  std::vector<std::string> every = {"-", "**every", "command**:"};
  for (const FlagHelp& f : EveryCommandFlags().flags) every.push_back(Item(f));
  std::string text = WrapTokens(every, "  ");
  for (const Entry& e : entries) {
    std::vector<std::string> tokens = {"-"};
    // A command's own group, titled by its name, need not name the command again.
    const bool own = e.commands.size() == 1 &&
                     (e.title == e.commands[0] || e.title.rfind(e.commands[0] + " (", 0) == 0);
    std::string head = "**" + e.title + "**";
    if (!own) {
      for (size_t i = 0; i < e.commands.size(); ++i) {
        head += (i == 0 ? " (" : ", ") + e.commands[i];
      }
      head += ")";
    }
    head += ":";
    for (size_t start = 0; start < head.size();) {  // the head wraps at its spaces
      size_t end = head.find(' ', start);
      if (end == std::string::npos) end = head.size();
      tokens.push_back(head.substr(start, end - start));
      start = end + 1;
    }
    tokens.insert(tokens.end(), e.items.begin(), e.items.end());
    text += WrapTokens(tokens, "  ");
  }
  return text;
}

void WriteUsage(std::ostream& out) {
  out << "usage: autopar-tune [COMMAND] [FLAGS]   (flags alone run tune)\n"
         "       autopar-tune COMMAND --help | help COMMAND | --version\n\ncommands:\n";
  for (const CommandHelp& c : Commands()) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-19s %s\n", c.name, c.summary);
    out << line;
  }
  out << "\nautopar-tune COMMAND --help lists the command's flags; docs/cli.md has them all.\n"
         "exit codes: 0 ok, 1 environment or trial failure, 2 bad input (the message names the\n"
         "flag), 3 no feasible configuration (predict: it does not fit), 4 study locked or\n"
         "mismatched\n";
}

void WriteCommandHelp(std::ostream& out, const CommandHelp& command) {
  out << "usage: autopar-tune " << command.name << (command.groups.empty() ? "" : " [FLAGS]")
      << "\n"
      << command.summary << "\n"
      << command.details;
  for (const FlagGroup* g : command.groups) WriteGroup(out, *g);
  WriteGroup(out, EveryCommandFlags());
}

const char* Version() { return AUTOPAR_VERSION_STRING; }

}  // namespace autopar::cli
