// The repository itself, as a reader finds it: no tracked file points outside the
// repository, every relative link of the Markdown pages resolves inside it, every link to
// a code line ([`name`](path#L42)) lands on a line that names `name`, and the reading
// order of docs/design.md gives each file's true length.
//
// The files are those `git ls-files` lists (every file under the source directory but
// the build trees when there is no git checkout, as in an unpacked archive).
#include "catch_compat.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = MINIGRAD_SOURCE_DIR;

std::vector<std::string> tracked_files() {
  std::vector<std::string> files;
  if (fs::exists(kRoot / ".git")) {
    const std::string command = "git -C '" + kRoot.string() + "' ls-files 2>/dev/null";
    if (std::FILE* pipe = ::popen(command.c_str(), "r")) {
      char line[4096];
      while (std::fgets(line, sizeof line, pipe) != nullptr) {
        std::string name(line);
        while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
        if (!name.empty()) files.push_back(name);
      }
      if (::pclose(pipe) == 0 && !files.empty()) return files;
      files.clear();
    }
  }
  for (auto it = fs::recursive_directory_iterator(kRoot); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name == ".git" || name == ".deps" || name.rfind("build", 0) == 0)) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(fs::relative(it->path(), kRoot).string());
  }
  return files;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool is_text(const std::string& content) {
  return content.find('\0', 0) == std::string::npos;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Markdown outside fenced code blocks (whose brackets are code, not links), with the
// fenced lines blanked so that line numbers stay those of the file.
std::string without_code_blocks(const std::string& markdown) {
  std::string out;
  bool fenced = false;
  for (const std::string& line : lines_of(markdown)) {
    const bool fence = line.find("```") != std::string::npos &&
                       line.find_first_not_of(" \t") == line.find("```");
    if (fence) fenced = !fenced;
    out += (fence || fenced) ? "\n" : line + "\n";
  }
  return out;
}

struct Link {
  std::string text, target;
  int line = 0;  // in the Markdown file
};

std::vector<Link> links_of(const std::string& markdown) {
  const std::string text = without_code_blocks(markdown);
  static const std::regex link(R"(\[([^\]]*)\]\(([^)\s]+)\))");
  std::vector<Link> links;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), link); it != std::sregex_iterator();
       ++it) {
    const auto at = static_cast<size_t>(it->position(0));
    const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
    links.push_back({(*it)[1].str(), (*it)[2].str(), line});
  }
  return links;
}

// The identifier a code-line link names: the link text without backticks and without a
// trailing argument list, then its last identifier ("comm::reduce_add_coalesced" ->
// "reduce_add_coalesced", "scatter(input, devices, dim)" -> "scatter").
std::string named_identifier(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), '`'), text.end());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (!text.empty() && text.back() == ')' && text.find('(') != std::string::npos)
    text.erase(text.find('('));
  static const std::regex identifier(R"([A-Za-z_][A-Za-z0-9_]*)");
  std::string last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), identifier);
       it != std::sregex_iterator(); ++it)
    last = it->str();
  return last;
}

bool has_word(const std::string& line, const std::string& word) {
  const auto is_ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = line.find(word); at != std::string::npos; at = line.find(word, at + 1)) {
    const bool starts = at == 0 || !is_ident(line[at - 1]);
    const bool ends = at + word.size() == line.size() || !is_ident(line[at + word.size()]);
    if (starts && ends) return true;
  }
  return false;
}

// Whether `line` defines `name`: a class, struct, enum, alias or macro of that name, or a
// function whose name follows a type or a qualifier ("void Optimizer::step() {",
// "Tensor forward(const Tensor& x) override;", "def plan(batch):"), not a call
// ("opt.step();", "run_action(s, a);", "return step(x);").
bool defines(const std::string& line, const std::string& name) {
  const std::regex type_like("(class|struct|enum|using|define)\\s+(class\\s+)?(\\w+::)*" + name + "\\b");
  if (std::regex_search(line, type_like)) return true;
  static const std::set<std::string> keywords{"return", "else", "throw", "new", "delete", "case",
                                              "co_return", "not", "and", "or", "in", "await"};
  const auto is_ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = line.find(name); at != std::string::npos; at = line.find(name, at + 1)) {
    const size_t end = at + name.size();
    if ((at > 0 && is_ident(line[at - 1])) || (end < line.size() && is_ident(line[end]))) continue;
    const size_t paren = line.find_first_not_of(' ', end);
    if (paren == std::string::npos || line[paren] != '(') continue;
    size_t before = at;  // skip a qualifier chain "Pipe::Run::"
    bool qualified = false;
    while (before >= 2 && line.compare(before - 2, 2, "::") == 0) {
      qualified = true;
      before -= 2;
      while (before > 0 && is_ident(line[before - 1])) --before;
    }
    if (qualified && (before == 0 || line[before - 1] == ' ' || line[before - 1] == '\t')) {
      // "Foo::Foo(" at the start of a line, or after a type
      if (line.find_first_not_of(" \t") == before) return true;
    }
    size_t prev = before;
    while (prev > 0 && (line[prev - 1] == ' ' || line[prev - 1] == '\t')) --prev;
    if (prev == 0) continue;  // a call at the start of a statement
    const char c = line[prev - 1];
    if (c == '>' && prev >= 2 && line[prev - 2] == '-') continue;  // a->name(: a call
    if (c == '>' || c == '*' || c == '&') return true;
    if (!is_ident(c)) continue;
    size_t word = prev;
    while (word > 0 && is_ident(line[word - 1])) --word;
    if (keywords.count(line.substr(word, prev - word)) == 0) return true;
  }
  return false;
}

// Where the definition that holds line `number` (1-based) starts: the nearest line
// above at column 0 (namespaces are not indented here), or one that opens a function
// body: it ends with '{' after a parameter list, and is no if/for/while/switch/catch and
// no lambda or initializer (no '='). Comments and blank lines never count.
bool is_comment_or_blank(const std::string& l) {
  const size_t at = l.find_first_not_of(" \t");
  return at == std::string::npos || l.compare(at, 2, "//") == 0 || l.compare(at, 1, "#") == 0 ||
         l.compare(at, 2, "/*") == 0 || l.compare(at, 1, "*") == 0;
}
bool opens_definition(const std::string& l) {
  if (!l.empty() && !std::isspace(static_cast<unsigned char>(l[0]))) return true;
  std::string t = l;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty() || t.back() != '{' || t.find(')') == std::string::npos) return false;
  if (t.find('=') != std::string::npos) return false;
  static const std::regex control(R"(^\s*(\}\s*)?(if|for|while|switch|catch|else|do|try)\b)");
  return !std::regex_search(t, control);
}

// Where `name` is first named in the definition that holds line `number`: the line itself
// when it defines `name` or no earlier line of its definition names it; otherwise that
// earlier line (a link to a use of `step` deep inside Optimizer::step is sent to the
// line that defines it).
int first_naming_in_definition(const std::vector<std::string>& lines, int number,
                               const std::string& name) {
  const std::string& linked = lines[static_cast<size_t>(number - 1)];
  if (defines(linked, name) || opens_definition(linked)) return number;
  int first = number;
  for (int n = number - 1; n >= 1; --n) {
    const std::string& l = lines[static_cast<size_t>(n - 1)];
    if (is_comment_or_blank(l)) continue;
    if (has_word(l, name)) first = n;
    if (opens_definition(l)) break;
  }
  return first;
}

// Problems of one link of `page` (a path relative to the root); empty when it is fine.
std::string check_link(const std::string& page, const Link& link) {
  const std::string& target = link.target;
  if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 ||
      target.rfind("mailto:", 0) == 0 || target[0] == '#')
    return {};
  const std::string where = page + ":" + std::to_string(link.line) + ": [" + link.text + "](" +
                            target + "): ";
  const size_t hash = target.find('#');
  const std::string path = target.substr(0, hash);
  const std::string anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
  const fs::path resolved = (fs::path(page).parent_path() / path).lexically_normal();
  if (resolved.empty() || *resolved.begin() == "..") return where + "points outside the repository";
  if (!fs::exists(kRoot / resolved)) return where + resolved.string() + " does not exist";
  if (anchor.size() < 2 || anchor[0] != 'L' || !std::isdigit(static_cast<unsigned char>(anchor[1])))
    return {};
  const int number = std::stoi(anchor.substr(1));
  const std::vector<std::string> lines = lines_of(read_file(kRoot / resolved));
  if (number < 1 || number > static_cast<int>(lines.size()))
    return where + resolved.string() + " has " + std::to_string(lines.size()) + " lines";
  const std::string name = named_identifier(link.text);
  if (name.empty()) return where + "the text of a link to a code line must name what is there";
  if (!has_word(lines[static_cast<size_t>(number - 1)], name))
    return where + "line " + std::to_string(number) + " of " + resolved.string() +
           " does not name '" + name + "': " + lines[static_cast<size_t>(number - 1)];
  const int first = first_naming_in_definition(lines, number, name);
  if (first != number)
    return where + "line " + std::to_string(number) + " of " + resolved.string() +
           " is not where '" + name + "' is defined or first named in its function: line " +
           std::to_string(first) + " is: " + lines[static_cast<size_t>(first - 1)];
  return {};
}

std::string join(const std::vector<std::string>& problems) {
  std::string out;
  for (const std::string& p : problems) out += "\n  " + p;
  return out;
}

}  // namespace

TEST_CASE("repository: no tracked file points outside the repository") {
  // Spelled in pieces, so that this file does not name what it looks for.
  const std::vector<std::string> forbidden{std::string("../") + "shared",
                                           std::string("/wo") + "rk/",
                                           std::string("DESIGN") + ".md"};
  std::vector<std::string> problems;
  size_t scanned = 0;
  for (const std::string& file : tracked_files()) {
    const std::string content = read_file(kRoot / file);
    if (!is_text(content)) continue;
    ++scanned;
    const std::vector<std::string> lines = lines_of(content);
    for (size_t i = 0; i < lines.size(); ++i)
      for (const std::string& word : forbidden)
        if (lines[i].find(word) != std::string::npos)
          problems.push_back(file + ":" + std::to_string(i + 1) + ": names '" + word + "'");
  }
  INFO("scanned " << scanned << " text files" << join(problems));
  CHECK(scanned > 100);
  CHECK(problems.empty());
}

TEST_CASE("repository: every link of the Markdown pages resolves, code-line links to their name") {
  std::vector<std::string> problems;
  size_t code_line_links = 0;
  for (const std::string& file : tracked_files()) {
    if (fs::path(file).extension() != ".md") continue;
    for (const Link& link : links_of(read_file(kRoot / file))) {
      if (link.target.find("#L") != std::string::npos) ++code_line_links;
      const std::string problem = check_link(file, link);
      if (!problem.empty()) problems.push_back(problem);
    }
  }
  INFO(code_line_links << " links to code lines" << join(problems));
  CHECK(code_line_links > 10);
  CHECK(problems.empty());
}

TEST_CASE("repository: the link checker's rule on a code line") {
  CHECK(named_identifier("`comm::reduce_add_coalesced`") == "reduce_add_coalesced");
  CHECK(named_identifier("`scatter(input, devices, dim)`") == "scatter");
  CHECK(named_identifier("`DataParallel::forward`") == "forward");
  CHECK(named_identifier("scatter.cpp") == "cpp");  // a file name names no line: it fails
  CHECK(has_word("Tensor DataParallel::forward(const Tensor& input) {", "forward"));
  CHECK_FALSE(has_word("Tensor DataParallel::forward_all(const Tensor& input) {", "forward"));
  const std::string stale = check_link(
      "docs/x.md", {"`run_data_parallel`", "../minigrad/parallel/data_parallel.cpp#L1", 3});
  CHECK_THAT(stale, MG_CONTAINS("docs/x.md:3: ") &&
                        MG_CONTAINS("line 1 of minigrad/parallel/data_parallel.cpp does not "
                                    "name 'run_data_parallel'"));
  CHECK_THAT(check_link("README.md", {"x", "../outside.md", 1}),
             MG_CONTAINS("points outside the repository"));
  CHECK_THAT(check_link("README.md", {"x", "docs/no-such-page.md", 1}),
             MG_CONTAINS("docs/no-such-page.md does not exist"));
  CHECK(check_link("README.md", {"design", "docs/design.md", 1}).empty());

  // A use of `step` inside the function that defines it is sent to the definition; the
  // first use inside another function, or a definition at column 0, is where it is named.
  const std::vector<std::string> code{
      "// step: what it does",             // 1: a comment does not count
      "void Optimizer::step() {",          // 2: defines it
      "  if (done) return;",               // 3
      "  local_->step();",                 // 4: a use after the definition
      "}",                                 // 5
      "void Trainer::run() {",             // 6
      "  // calls step once",              // 7
      "  opt.step();",                     // 8: the first naming in run()
      "  opt.step();",                     // 9: not the first
      "}"};
  CHECK(defines("void Optimizer::step() {", "step"));
  CHECK(defines("  void reply(Client& c, std::string bytes) {", "reply"));
  CHECK(defines("class Pipe::Backward final : public Node {", "Backward"));
  CHECK(defines("Pipe::Pipe(std::vector<Device> devices) {", "Pipe"));
  CHECK(defines("def plan(batch):", "plan"));
  CHECK_FALSE(defines("  local_->step();", "step"));
  CHECK_FALSE(defines("  run_action(s, a);", "run_action"));
  CHECK_FALSE(defines("  return step(x);", "step"));
  CHECK_FALSE(defines("  auto y = model.forward(x);", "forward"));
  CHECK(first_naming_in_definition(code, 2, "step") == 2);
  CHECK(first_naming_in_definition(code, 4, "step") == 2);
  CHECK(first_naming_in_definition(code, 8, "step") == 8);
  CHECK(first_naming_in_definition(code, 9, "step") == 8);
}

// Each row "| n | [`path`](../path) | lines | ... |" of the reading order: the file's
// length now, within 10% (at least 5 lines) so that small edits need no update; and the
// total row is the sum of the rows.
TEST_CASE("repository: docs/design.md's reading order gives each file's length") {
  const std::string page = read_file(kRoot / "docs/design.md");
  REQUIRE_FALSE(page.empty());
  static const std::regex row(R"(^\| *\d+ *\| *\[[^\]]*\]\(\.\./([^)]+)\) *\| *(\d+) *\|)");
  static const std::regex total_row(R"(^\| *\| *\*\*total\*\* *\| *\*\*([\d,]+)\*\* *\|)");
  std::vector<std::string> problems;
  long listed_sum = 0, stated_total = -1;
  int rows = 0;
  for (const std::string& line : lines_of(page)) {
    std::smatch m;
    if (std::regex_search(line, m, row)) {
      ++rows;
      const std::string path = m[1];
      const long listed = std::stol(m[2]);
      listed_sum += listed;
      if (!fs::exists(kRoot / path)) {
        problems.push_back(path + " does not exist");
        continue;
      }
      const auto actual = static_cast<long>(lines_of(read_file(kRoot / path)).size());
      if (std::abs(actual - listed) > std::max(5L, listed / 10))
        problems.push_back(path + ": listed with " + std::to_string(listed) + " lines, has " +
                           std::to_string(actual));
    } else if (std::regex_search(line, m, total_row)) {
      std::string digits = m[1];
      digits.erase(std::remove(digits.begin(), digits.end(), ','), digits.end());
      stated_total = std::stol(digits);
    }
  }
  INFO(join(problems));
  CHECK(rows >= 10);
  CHECK(problems.empty());
  CHECK(stated_total == listed_sum);
}

// The rule of docs/design.md: a file of minigrad/<layer>/ includes from its own layer and
// the layers below it only (plan/ on top, pricing models' splits; models/ sits above parallel/: how a model is split over a mesh,
// as torchtitan's parallelize_llama, lives with the model). cuda/ implements core's Backend beside the others; of
// parallel/, only the NCCL files (built with CUDA) reach into it.
TEST_CASE("repository: the library's includes point down the layers") {
  const std::map<std::string, std::set<std::string>> allowed{
      {"core", {"core"}},
      {"autograd", {"core", "autograd"}},
      {"data", {"core", "autograd", "data"}},
      {"nn", {"core", "autograd", "nn"}},
      {"parallel", {"core", "autograd", "nn", "data", "parallel"}},
      {"models", {"core", "autograd", "nn", "data", "parallel", "models"}},
      {"plan", {"core", "autograd", "nn", "data", "parallel", "models", "plan"}},
      {"cuda", {"core", "cuda"}},
  };
  static const std::regex include(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  std::vector<std::string> problems;
  size_t checked = 0;
  for (const std::string& file : tracked_files()) {
    const fs::path path(file);
    if (path.begin() == path.end() || *path.begin() != "minigrad" || ++path.begin() == path.end())
      continue;
    const std::string layer = (++path.begin())->string();
    const auto rule = allowed.find(layer);
    if (rule == allowed.end()) continue;  // minigrad.h, the umbrella, includes every layer
    const std::vector<std::string> lines = lines_of(read_file(kRoot / file));
    for (size_t i = 0; i < lines.size(); ++i) {
      std::smatch m;
      if (!std::regex_search(lines[i], m, include)) continue;
      ++checked;
      const std::string target = m[2];
      const std::string where = file + ":" + std::to_string(i + 1) + ": " + target;
      if (m[1] == "\"") {
        if (target.find("..") != std::string::npos)
          problems.push_back(where + " (a relative include leaving its folder)");
        continue;
      }
      if (target.rfind("minigrad/", 0) != 0) continue;  // the standard library, fmt, BLAS ...
      const std::string to = target.substr(9, target.find('/', 9) - 9);
      const bool nccl_file = file.rfind("minigrad/parallel/c10d/nccl/", 0) == 0 ||
                             file == "minigrad/parallel/devices/nccl_communicator.cpp";
      if (rule->second.count(to) == 0 && !(layer == "parallel" && to == "cuda" && nccl_file))
        problems.push_back(where + " (" + layer + " may not include " + to + ")");
    }
  }
  INFO(checked << " includes checked" << join(problems));
  CHECK(checked > 300);
  CHECK(problems.empty());
}

// Inside parallel/, the algorithms include the machinery and never the reverse: the
// process groups and the store (c10d/) know nothing of DDP, sharding, pipelines or tensor
// parallelism; the store knows nothing but itself; the one-process plumbing (devices/)
// knows no process group; DDP and sharding do not include each other.
TEST_CASE("repository: inside parallel/, includes point from the algorithms to the machinery") {
  const std::vector<std::string> algorithms{"ddp/", "sharded/", "pipeline/", "tensor_parallel/",
                                            "context_parallel/"};
  // folder -> the folders of parallel/ it may not include
  const std::vector<std::pair<std::string, std::vector<std::string>>> rules{
      {"c10d/store/", {"c10d/process_group", "c10d/rendezvous", "c10d/device_mesh",
                       "c10d/gloo/", "c10d/nccl/", "devices/", "ddp/", "sharded/", "pipeline/",
                       "tensor_parallel/", "context_parallel/"}},
      {"c10d/", algorithms},
      {"devices/", {"c10d/", "ddp/", "sharded/", "pipeline/", "tensor_parallel/",
                    "context_parallel/"}},
      {"ddp/", {"sharded/", "pipeline/", "tensor_parallel/"}},
      {"sharded/", {"ddp/", "pipeline/", "tensor_parallel/"}},
  };
  static const std::regex include(R"(^\s*#\s*include\s*<minigrad/parallel/([^>]+)>)");
  const std::string prefix = "minigrad/parallel/";
  std::vector<std::string> problems;
  size_t checked = 0;
  for (const std::string& file : tracked_files()) {
    if (file.rfind(prefix, 0) != 0) continue;
    const std::string folder = file.substr(prefix.size());
    const auto rule = std::find_if(rules.begin(), rules.end(), [&](const auto& r) {
      return folder.rfind(r.first, 0) == 0;
    });
    if (rule == rules.end()) continue;
    const std::vector<std::string> lines = lines_of(read_file(kRoot / file));
    for (size_t i = 0; i < lines.size(); ++i) {
      std::smatch m;
      if (!std::regex_search(lines[i], m, include)) continue;
      ++checked;
      const std::string target = m[1];
      for (const std::string& forbidden : rule->second)
        if (target.rfind(forbidden, 0) == 0)
          problems.push_back(file + ":" + std::to_string(i + 1) + ": includes parallel/" +
                             target + " (" + rule->first + " may not include " + forbidden + ")");
    }
  }
  INFO(checked << " includes checked" << join(problems));
  CHECK(checked > 50);
  CHECK(problems.empty());
}

// What the layout promises: <minigrad/...> is a path from the repository root, in the
// library, the programs, the benchmarks and the tests alike.
TEST_CASE("repository: every #include <minigrad/...> is a file of the repository") {
  static const std::regex include(R"(^\s*#\s*include\s*<(minigrad/[^>]+)>)");
  std::vector<std::string> problems;
  size_t checked = 0;
  for (const std::string& file : tracked_files()) {
    const std::string ext = fs::path(file).extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh") continue;
    const std::vector<std::string> lines = lines_of(read_file(kRoot / file));
    for (size_t i = 0; i < lines.size(); ++i) {
      std::smatch m;
      if (!std::regex_search(lines[i], m, include)) continue;
      ++checked;
      if (!fs::is_regular_file(kRoot / m[1].str()))
        problems.push_back(file + ":" + std::to_string(i + 1) + ": <" + m[1].str() + ">");
    }
  }
  INFO(checked << " includes checked" << join(problems));
  CHECK(checked > 500);
  CHECK(problems.empty());
}

// catch_discover_tests makes each TEST_CASE a CTest test named after it, and CTest cuts a
// name at ';' (a CMake list): each piece then runs a filter that matches no test and is
// reported as passed, so the case itself never runs under make test.
TEST_CASE("repository: no test case's name holds a semicolon") {
  static const std::regex test_case(R"re(TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+))re");
  std::vector<std::string> problems;
  int checked = 0;
  for (const std::string& file : tracked_files()) {
    if (file.rfind("tests/", 0) != 0 || fs::path(file).extension() != ".cpp") continue;
    const std::string text = read_file(kRoot / file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), test_case);
         it != std::sregex_iterator(); ++it) {
      ++checked;
      const std::string name = (*it)[1];
      if (name.find(';') != std::string::npos) problems.push_back(file + ": " + name);
    }
  }
  INFO(checked << " test cases checked" << join(problems));
  CHECK(checked > 500);
  CHECK(problems.empty());
}
