#pragma once
// CLI11's classes by name: a header whose functions take a CLI::App or
// return a CLI::Validator names them through this one. CLI/CLI.hpp is the
// whole library as header code, and every file that includes it compiles it
// again; only the files that declare options or call a validator include it.
namespace CLI {
class App;
class Validator;
} // namespace CLI
