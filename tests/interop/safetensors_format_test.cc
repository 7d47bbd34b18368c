// Tests of src/interop/safetensors_format: the header and index round-trip, and every kind of
// bad header is refused naming what is wrong.

#include "src/interop/safetensors_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace asyncckpt::interop {
namespace {

using ::testing::HasSubstr;

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// Appends rather than writes "{" + Entry(...), which GCC 12 at -O3 flags with a false -Wrestrict.
std::string Object(std::initializer_list<std::string> entries) {
  std::string json = "{";
  for (const std::string& entry : entries) {
    if (json.size() > 1) json += ",";
    json += entry;
  }
  json += "}";
  return json;
}

Status ParseError(const std::string& json, uint64_t data_bytes) {
  return ParseSafetensorsHeader(json, data_bytes, "f.safetensors").status();
}

TEST(SafetensorsFormatTest, AHeaderRoundTripsThroughEncodeAndParse) {
  std::vector<SafetensorsTensor> tensors = {
      {"model.embed\xc3\xa9\"q\"", DType::kBF16, {3, 2}, 0, 12},
      {"scalar", DType::kF64, {}, 12, 20},
      {"empty", DType::kI32, {0, 4}, 20, 20},
      {"mask", DType::kBool, {5}, 20, 25},
  };
  const std::string json = EncodeSafetensorsHeader(tensors, {{"format", "pt"}});
  EXPECT_EQ(json.size() % 8, 0u);
  Result<SafetensorsHeader> parsed = ParseSafetensorsHeader(json, 25, "f");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->tensors.size(), 4u);
  EXPECT_EQ(parsed->metadata.at("format"), "pt");
  EXPECT_EQ(parsed->tensors[0].name, tensors[0].name);
  EXPECT_EQ(parsed->tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(parsed->tensors[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(parsed->tensors[1].shape, std::vector<int64_t>{});
  EXPECT_EQ(parsed->tensors[3].begin, 20u);
  EXPECT_EQ(parsed->tensors[3].end, 25u);
}

TEST(SafetensorsFormatTest, EveryDTypeOfTheLibraryHasASafetensorsName) {
  for (DType dtype : kAllDTypes) {
    EXPECT_EQ(SafetensorsDType(SafetensorsDTypeName(dtype)), dtype) << DTypeName(dtype);
  }
  EXPECT_FALSE(SafetensorsDType("C64").has_value());
}

TEST(SafetensorsFormatTest, EscapesAndSurrogatePairsDecodeToUtf8) {
  const std::string json = Object({Entry("a\\u00e9\\ud83d\\ude00\\n", "U8", "[1]", 0, 1)});
  Result<SafetensorsHeader> parsed = ParseSafetensorsHeader(json, 1, "f");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->tensors[0].name, "a\xc3\xa9\xf0\x9f\x98\x80\n");
}

TEST(SafetensorsFormatTest, AnUnknownDTypeIsRefusedNamingTheTensor) {
  Status status = ParseError(Object({Entry("z", "C64", "[2]", 0, 16)}), 16);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tensor \"z\": dtype \"C64\""));
  EXPECT_THAT(status.message(), HasSubstr("f.safetensors"));
}

TEST(SafetensorsFormatTest, OverlappingTensorsAreRefusedNamingBoth) {
  Status status =
      ParseError(Object({Entry("a", "U8", "[4]", 0, 4), Entry("b", "U8", "[4]", 2, 6)}), 6);
  EXPECT_THAT(status.message(), HasSubstr("\"a\" and \"b\" overlap"));
}

TEST(SafetensorsFormatTest, AGapOrBytesNoTensorCoversAreRefused) {
  EXPECT_THAT(ParseError(Object({Entry("a", "U8", "[4]", 0, 4), Entry("b", "U8", "[2]", 6, 8)}), 8)
                  .message(),
              HasSubstr("no tensor covers data bytes [4, 6)"));
  EXPECT_THAT(ParseError(Object({Entry("a", "U8", "[4]", 0, 4)}), 9).message(),
              HasSubstr("no tensor covers data bytes [4, 9)"));
  EXPECT_THAT(ParseError(Object({Entry("a", "U8", "[4]", 0, 4)}), 3).message(),
              HasSubstr("past the file's 3 bytes"));
}

TEST(SafetensorsFormatTest, AShapeThatDisagreesWithItsOffsetsIsRefused) {
  EXPECT_THAT(ParseError(Object({Entry("a", "F32", "[3]", 0, 8)}), 8).message(),
              HasSubstr("tensor \"a\": data_offsets [0, 8) hold 8 bytes"));
  EXPECT_THAT(ParseError(Object({Entry("a", "F32", "[4294967296,4294967296]", 0, 8)}), 8).message(),
              HasSubstr("overflows"));
}

TEST(SafetensorsFormatTest, MalformedJsonIsRefusedNeverACrash) {
  const std::vector<std::string> bad = {
      "",
      "{",
      "[]",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}} trailing",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0.0,1]}}",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"a\":{}}",
      "{\"\\ud800\":1}",
      "{\"a\x01\":1}",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}",
      "{\"__metadata__\":{\"k\":1}}",
      std::string(100, '[') + std::string(100, ']'),
  };
  for (const std::string& json : bad) {
    Status status = ParseError(json, 1);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << json;
  }
}

TEST(SafetensorsFormatTest, TheIndexRoundTripsAndRefusesFileNamesWithPaths) {
  const std::string json = EncodeSafetensorsIndex(
      {{"a.weight", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}},
      123);
  Result<std::map<std::string, std::string>> parsed = ParseSafetensorsIndex(json, "i");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->at("b"), "model-00002-of-00002.safetensors");
  EXPECT_THAT(ParseSafetensorsIndex("{\"weight_map\":{\"a\":\"../x\"}}", "i").status().message(),
              HasSubstr("tensor \"a\" maps to no plain file name"));
  EXPECT_THAT(ParseSafetensorsIndex("{\"metadata\":{}}", "i").status().message(),
              HasSubstr("no \"weight_map\""));
}

}  // namespace
}  // namespace asyncckpt::interop
