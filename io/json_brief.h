// io/json_brief.h: JSON values quoted in error messages (private to io/).
//
// NOTE [bounded dump]: nlohmann's dump() recurses once per nesting level, so
// dumping a value from a hostile file ("[[[[...", a million deep) overflows the
// stack. brief() dumps only scalars and containers of scalars; anything deeper
// is described by kind and size. Parsing and destroying such values is
// iterative in nlohmann 3.11 and safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace aspen::io {

inline std::string json_brief(const nlohmann::json& v) {
  if (v.is_structured())
    for (const nlohmann::json& e : v)
      if (e.is_structured())
        return std::string("a JSON ") + v.type_name() + " of " + std::to_string(v.size()) +
               (v.size() == 1 ? " element" : " elements");
  return v.dump();
}

}  // namespace aspen::io
