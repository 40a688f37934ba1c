// The sparge command-line tool: bench (block map + block-sparse attention vs the dense baseline),
// validate (quick semantic checks of a backend), topk (token-level top-k timing). See docs/tool.md.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "args.h"
#include "bench.h"
#include "commands.h"
#include "common.h"

namespace sparge::tool {

void print_usage() {
  std::printf(
      "usage: sparge [COMMAND] [-flag=value ...]\n"
      "\n"
      "commands:\n"
      "  bench     time the block map, block-sparse attention and the dense baseline (default command)\n"
      "  validate  quick semantic checks of one backend on small shapes, one PASS/FAIL line each\n"
      "  topk      time topk_select on random scores\n"
      "  help      this text (also -h, --help)\n"
      "With no arguments: bench on cuda at b2 h32 s16384 d128 fp16 topk 0.4 when the CUDA backend is usable,\n"
      "otherwise a small CPU run (b1 h2 s2048 d64 -v=1).\n"
      "\n"
      "bench flags:\n"
      "  -b=2 -h=32 -hk=<h> -s=16384 -sk=<s> -d=128   shape: batch, query heads, kv heads, lengths, head dim\n"
      "  -topk=0.4 | -cdf=0.9       selection (one of them; values in (0, 1]); default topk 0.4\n"
      "  -simthreshd1=0.001         self-similarity threshold; negative = no similarity test\n"
      "  -pvthreshd=<x>             PV-skip threshold in log2 units (upstream default 50); default off\n"
      "  -causal=0 -sink=0 -smoothk=1 -scale=0 (0 = 1/sqrt(d))\n"
      "  -blkq=128 -blkk=64         block sizes, 64 or 128 (upstream SpargeAttn's default)\n"
      "  -dtype=fp16|bf16|fp32      inputs and output (fp32: cpu only)\n"
      "  -layout=nhd|hnd            storage of q/k/v/o ([b,s,h,d] or [b,h,s,d])\n"
      "  -recipe=none|fp8           fp8: e4m3 Q/K/V and fp8 GEMMs (cuda: sm_90, d 128, blkq 128; docs/quantized.md)\n"
      "  -backend=cpu|cuda          default cuda when usable\n"
      "  -warmup=N -repeat=N        default 2/10 on cuda, 1/3 on cpu; median, min and max are reported\n"
      "  -threads=0                 cpu threads (0 = all)\n"
      "  -seed=N                    input seed (default: fresh, printed)\n"
      "  -v=1                       validate: block map vs cpu, LUT form, O and LSE vs the fp64 oracle\n"
      "  -oracle_gflop=100          oracle budget; larger shapes are validated on a random subset\n"
      "\n"
      "validate flags: -backend=cpu|cuda -dtype=fp16|bf16|fp32 -threads=0 -seed=N\n"
      "                -filter=all|block_map|sparse|dense|merge|topk|compact|gather|errors\n"
      "topk flags:     -r=512 -n=131072 -k=2048 -dtype=fp32|fp16 -backend=cpu|cuda -v=1 -warmup -repeat -threads -seed\n"
      "\n"
      "exit codes: 0 ok, 1 a validation FAIL, 2 bad command line, 3 an error from the library or CUDA\n");
}

namespace {

// The default run: the PERF.md shape on cuda when the backend takes it, else a small CPU shape.
std::vector<std::string> default_bench_args() {
  if (cuda_available()) {
    std::vector<std::string> gpu = {"-backend=cuda", "-b=2", "-h=32", "-s=16384", "-d=128", "-dtype=fp16", "-topk=0.4"};
    std::vector<char*> argv;
    for (auto& s : gpu) argv.push_back(s.data());
    Args a("bench", static_cast<int>(argv.size()), argv.data(), 0);
    const Status st = parse_bench(a).precheck();
    if (st.ok()) {
      std::printf("sparge: no arguments; default: bench on cuda at the PERF.md shape (b2 h32 s16384 d128 fp16 topk 0.4)\n");
      return gpu;
    }
    std::printf("sparge: no arguments; the CUDA backend does not take the PERF.md shape (%s)\n", st.message().c_str());
  }
  std::printf("sparge: no arguments; default: a small CPU bench with validation (b1 h2 s2048 d64 -v=1)\n");
  return {"-backend=cpu", "-b=1", "-h=2", "-s=2048", "-d=64", "-v=1"};
}

int dispatch(int argc, char** argv) {
  if (argc <= 1) {
    auto args = default_bench_args();
    std::vector<char*> v;
    for (auto& s : args) v.push_back(s.data());
    Args a("bench", static_cast<int>(v.size()), v.data(), 0);
    return run_bench(parse_bench(a));
  }
  const std::string cmd = argv[1];
  if (cmd == "help" || cmd == "-h" || cmd == "--help" || cmd == "-help") {
    print_usage();
    return 0;
  }
  // A leading flag means bench, as in the seed's tile_example_sparge.
  const bool implicit = cmd.rfind('-', 0) == 0;
  const int first = implicit ? 1 : 2;
  const std::string name = implicit ? "bench" : cmd;
  for (int i = first; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      print_usage();
      return 0;
    }
  }
  Args a(name, argc, argv, first);
  if (name == "bench") return run_bench(parse_bench(a));
  if (name == "validate") return run_validate(a);
  if (name == "topk") return run_topk(a);
  throw UsageError("sparge: unknown command '" + cmd + "' (commands: bench, validate, topk, help)");
}

}  // namespace
}  // namespace sparge::tool

int main(int argc, char** argv) {
  using namespace sparge::tool;
  try {
    return dispatch(argc, argv);
  } catch (const UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", e.what());
    return kExitUsage;
  } catch (const ToolError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "sparge: error: %s\n", e.what());
    return kExitError;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "sparge: error: out of host memory (try a smaller shape)\n");
    return kExitError;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "sparge: error: %s\n", e.what());
    return kExitError;
  }
}
