// io/corrupt_test.cc: every file in io/testdata/corrupt/ must fail to load with
// a message containing the text its manifest gives.
//
// The manifests (MANIFEST.txt, written by fuzz/make_corpus.py, and
// MANIFEST.regressions.txt, fuzzer finds added by hand) hold lines
// "file<TAB>expected substring". st_* files are safetensors, read with
// SafetensorsFile::open and from_bytes; tj_* files are tokenizer.json, read
// with load_tokenizer_json and load_tokenizer_json_from_string; ox_* files are
// ONNX models, read with read_onnx_model. A file missing
// from the manifests, or a manifest entry without its file, fails the test.
#include <dirent.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "io/onnx.h"
#include "io/safetensors.h"
#include "io/test_files.h"
#include "io/tokenizer.h"

namespace aspen::io {
namespace {

const std::string kDir = std::string(ASPEN_IO_TESTDATA) + "/corrupt";

bool is_manifest(const std::string& name) { return name.rfind("MANIFEST", 0) == 0 && name.size() > 4 &&
                                                   name.substr(name.size() - 4) == ".txt"; }

std::set<std::string> list_files() {
  std::set<std::string> out;
  DIR* d = opendir(kDir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != ".." && !is_manifest(name)) out.insert(name);
  }
  closedir(d);
  return out;
}

// file -> expected substring, from every manifest; ADD_FAILURE on a bad line.
std::map<std::string, std::string> read_manifests(std::set<std::string> manifests) {
  std::map<std::string, std::string> out;
  for (const std::string& m : manifests) {
    std::ifstream in(kDir + "/" + m);
    EXPECT_TRUE(in) << m;
    std::string line;
    for (int lineno = 1; std::getline(in, line); ++lineno) {
      if (line.empty() || line[0] == '#') continue;
      const size_t tab = line.find('\t');
      if (tab == std::string::npos || tab == 0 || tab + 1 == line.size()) {
        ADD_FAILURE() << m << " line " << lineno << ": expected file<TAB>substring, found '" << line << "'";
        continue;
      }
      const std::string file = line.substr(0, tab);
      EXPECT_TRUE(out.emplace(file, line.substr(tab + 1)).second) << m << ": " << file << " listed twice";
    }
  }
  return out;
}

using test_files::read_bytes;

TEST(CorruptFiles, ManifestMatchesDirectory) {
  const std::set<std::string> files = list_files();
  ASSERT_FALSE(files.empty()) << kDir;
  const auto manifest = read_manifests({"MANIFEST.txt", "MANIFEST.regressions.txt"});
  for (const std::string& f : files) EXPECT_TRUE(manifest.count(f)) << f << " is not in a manifest";
  for (const auto& [f, expected] : manifest) EXPECT_TRUE(files.count(f)) << f << " is in a manifest but missing";
}

TEST(CorruptFiles, EachFailsWithItsMessage) {
  const auto manifest = read_manifests({"MANIFEST.txt", "MANIFEST.regressions.txt"});
  ASSERT_FALSE(manifest.empty());
  for (const auto& [file, expected] : manifest) {
    SCOPED_TRACE(file);
    const std::string path = kDir + "/" + file;
    const std::string bytes = read_bytes(path);
    if (file.rfind("st_", 0) == 0) {
      Result<SafetensorsFile> f = SafetensorsFile::open(path);
      ASSERT_FALSE(f.is_ok());
      EXPECT_NE(f.status().message().find(path + ": "), std::string::npos) << f.status().message();
      EXPECT_NE(f.status().message().find(expected), std::string::npos) << f.status().message();
      // The in-memory path shares the validation, so it gives the same error.
      Result<SafetensorsFile> m = SafetensorsFile::from_bytes(
          {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}, "mem");
      ASSERT_FALSE(m.is_ok());
      EXPECT_EQ(m.status().code(), f.status().code());
      EXPECT_NE(m.status().message().find(expected), std::string::npos) << m.status().message();
    } else if (file.rfind("tj_", 0) == 0) {
      auto t = load_tokenizer_json(path);
      ASSERT_FALSE(t.is_ok());
      EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
      EXPECT_NE(t.status().message().find(expected), std::string::npos) << t.status().message();
      auto m = load_tokenizer_json_from_string(bytes, "mem");
      ASSERT_FALSE(m.is_ok());
      EXPECT_EQ(m.status().code(), t.status().code());
      EXPECT_NE(m.status().message().find(expected), std::string::npos) << m.status().message();
    } else if (file.rfind("ox_", 0) == 0) {
      auto o = read_onnx_model(path);
      ASSERT_FALSE(o.is_ok());
      EXPECT_NE(o.status().message().find(path), std::string::npos) << o.status().message();
      EXPECT_NE(o.status().message().find(expected), std::string::npos) << o.status().message();
    } else {
      ADD_FAILURE() << "name must start with st_ (safetensors), tj_ (tokenizer.json) or ox_ (ONNX)";
    }
  }
}

}  // namespace
}  // namespace aspen::io
