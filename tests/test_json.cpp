#include <gtest/gtest.h>

#include "kqlora/core/error.hpp"
#include "kqlora/core/json.hpp"

using kqlora::json::parse;

TEST(Json, ParsesNestedValues) {
  const auto v =
      parse(R"( {"a": [1, -2.5e1, true, null], "b": {"c": "x\"\u00e9\ud83d\ude00"}} )", "t");
  ASSERT_EQ(v.object.size(), 2u);
  const auto& a = *v.find("a");
  ASSERT_EQ(a.array.size(), 4u);
  EXPECT_TRUE(a.array[0].is_integer);
  EXPECT_EQ(a.array[0].integer, 1);
  EXPECT_FALSE(a.array[1].is_integer);
  EXPECT_DOUBLE_EQ(a.array[1].number, -25.0);
  EXPECT_TRUE(a.array[2].boolean);
  EXPECT_EQ(a.array[3].kind, kqlora::json::Value::Kind::null);
  EXPECT_EQ(v.find("b")->find("c")->string, "x\"\xc3\xa9\xf0\x9f\x98\x80");
}

TEST(Json, RejectsMalformedTextWithPosition) {
  for (const char* bad : {"{", "{\"a\":}", "[1,]", "{\"a\":1,\"a\":2}", "01", "\"\\x\"", "[1] x",
                          "\"\\ud800\"", "tru"}) {
    try {
      parse(bad, "where.json");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const kqlora::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("where.json: JSON error at line 1"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Json, QuoteRoundTrips) {
  const std::string s = "a\"b\\c\n\x01";
  EXPECT_EQ(parse(kqlora::json::quote(s), "t").string, s);
}
