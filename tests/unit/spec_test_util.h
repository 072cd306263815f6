// Helpers shared by the spec tests: the fixtures under tests/data/spec and the field an
// InputError names.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "autopar/common/errors.h"

namespace autopar {

inline std::string ReadFixture(const std::string& name) {
  const std::string path = std::string(AUTOPAR_SOURCE_DIR) + "/tests/data/spec/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The field named by the InputError that `fn` throws; "" if it throws none.
inline std::string ErrorField(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const InputError& e) {
    if (message != nullptr) *message = e.what();
    return e.field();
  }
  return "";
}

}  // namespace autopar
