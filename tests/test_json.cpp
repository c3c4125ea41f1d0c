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
  for (const char* bad :
       {"{", "{\"a\":}", "[1,]", "{\"a\":1,\"a\":2}", "01", "\"\\x\"", "[1] x", "\"\\ud800\"",
        "tru", "3.5e0555", "-1e309"}) {  // (beyond double: found by fuzz_json)
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

// write: the text parses back to the same values in the same order (numbers bit for bit,
// integers as integers), and a float literal stays a float literal.
TEST(Json, WriteRoundTrips) {
  const std::string text =
      R"({"b": [1, -2.5, 9.999999747378752e-06, 1e300, 0.1], "a": {"x": null, "y": true,)"
      R"( "z": "q\"\\\n\u00e9"}, "c": [], "d": {}, "e": 100000.0, "f": -9007199254740993})";
  const auto v = kqlora::json::parse(text, "t");
  const std::string out = kqlora::json::write(v);
  const auto w = kqlora::json::parse(out, "out");
  ASSERT_EQ(w.object.size(), 6u);
  EXPECT_EQ(w.object[0].first, "b");
  EXPECT_EQ(w.object[1].first, "a");
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(w.object[0].second.array[i].number, v.object[0].second.array[i].number) << i;
  EXPECT_TRUE(w.object[0].second.array[0].is_integer);
  EXPECT_EQ(w.object[1].second.find("z")->string, "q\"\\\n\xc3\xa9");
  EXPECT_EQ(w.object[1].second.find("x")->kind, kqlora::json::Value::Kind::null);
  EXPECT_TRUE(w.object[1].second.find("y")->boolean);
  EXPECT_TRUE(w.find("c")->array.empty());
  EXPECT_TRUE(w.find("d")->object.empty());
  EXPECT_FALSE(w.find("e")->is_integer);
  EXPECT_EQ(w.find("e")->number, 100000.0);
  EXPECT_EQ(w.find("f")->integer, -9007199254740993LL);
  EXPECT_EQ(kqlora::json::write(w), out);
}
