// examples/find_package/generate_greedy.cc: a program of one's own that links
// an installed aspen (find_package(aspen), aspen::aspen) and continues a
// prompt greedily with a Hugging Face model directory.
//
//   generate_greedy MODEL_DIR PROMPT [NEW_TOKENS]
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "models/generate.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: generate_greedy MODEL_DIR PROMPT [NEW_TOKENS]\n";
    return 2;
  }
  const std::string dir = argv[1];
  auto tokenizer = aspen::io::load_tokenizer(dir);
  if (!tokenizer.is_ok()) {
    std::cerr << "error: " << tokenizer.status().to_string() << "\n";
    return 1;
  }
  const std::vector<int32_t> prompt = (*tokenizer)->encode(argv[2], /*add_special_tokens=*/false);
  aspen::models::GeneratorOptions options;
  options.max_prompt = int64_t(prompt.size());
  auto generator = aspen::models::Generator::open(dir, options);
  if (!generator.is_ok()) {
    std::cerr << "error: " << generator.status().to_string() << "\n";
    return 1;
  }
  aspen::models::SamplingOptions sampling;
  sampling.temperature = 0.0f;  // greedy
  sampling.max_new_tokens = argc > 3 ? std::atoi(argv[3]) : 16;
  auto out = (*generator)->generate({prompt}, sampling);
  if (!out.is_ok()) {
    std::cerr << "error: " << out.status().to_string() << "\n";
    return 1;
  }
  std::cout << argv[2] << (*tokenizer)->decode(out->front(), /*skip_special_tokens=*/true) << "\n";
  return 0;
}
