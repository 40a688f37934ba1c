// Test entry: collects the named cases of every registered generator, keeps those whose name
// matches --filter=REGEX (or SPARGE_FILTER), and hands them to GoogleTest.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>

#include "harness/harness.h"

namespace sparge::test {
std::vector<std::pair<std::string, Generator>>& all_generators();
}

int main(int argc, char** argv) {
  std::string filter;
  if (const char* f = std::getenv("SPARGE_FILTER")) filter = f;
  bool list = false;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--filter=", 9) == 0) {
      filter = argv[i] + 9;
    } else if (std::strcmp(argv[i], "--list") == 0) {
      list = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  testing::InitGoogleTest(&rest_argc, rest.data());
  const std::regex re(filter.empty() ? std::string(".*") : filter);
  std::printf("sparge tests: seed = 0x%llx (SPARGE_SEED=0x%llx reproduces)%s%s\n",
              static_cast<unsigned long long>(sparge::test::base_seed()),
              static_cast<unsigned long long>(sparge::test::base_seed()),
              filter.empty() ? "" : ", filter = ", filter.c_str());
  std::size_t n = 0;
  for (auto& [suite, gen] : sparge::test::all_generators()) {
    std::vector<sparge::test::Case> cases;
    gen(cases);
    for (auto& c : cases) {
      if (!std::regex_search(c.name, re)) continue;
      ++n;
      if (list) {
        std::printf("%s.%s\n", suite.c_str(), c.name.c_str());
        continue;
      }
      auto run = c.run;
      testing::RegisterTest(suite.c_str(), c.name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [run]() -> testing::Test* {
                              struct T : testing::Test {
                                std::function<void()> f;
                                void TestBody() override { f(); }
                              };
                              auto* t = new T;
                              t->f = run;
                              return t;
                            });
    }
  }
  if (list) {
    std::printf("%zu cases\n", n);
    return 0;
  }
  if (n == 0) {
    std::fprintf(stderr, "no case matches the filter '%s'\n", filter.c_str());
    return 1;
  }
  return RUN_ALL_TESTS();
}
