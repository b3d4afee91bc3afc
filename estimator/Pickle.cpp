#include "estimator/Pickle.h"

namespace metamem {
namespace {

constexpr char kProto = '\x80', kMark = '(', kEmptyDict = '}', kSetItems = 'u',
               kEmptyList = ']', kAppends = 'e', kBinInt = 'J', kLong1 = '\x8a',
               kBinUnicode = 'X', kNewTrue = '\x88', kNewFalse = '\x89', kStop = '.';

void little_endian(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

PickleWriter::PickleWriter() { out_ = {kProto, '\x02'}; }

void PickleWriter::begin_dict() { out_ += {kEmptyDict, kMark}; }
void PickleWriter::end_dict() { out_ += kSetItems; }
void PickleWriter::begin_list() { out_ += {kEmptyList, kMark}; }
void PickleWriter::end_list() { out_ += kAppends; }

void PickleWriter::string(const std::string& s) {
  out_ += kBinUnicode;
  little_endian(out_, s.size(), 4);
  out_ += s;
}

void PickleWriter::integer(std::int64_t value) {
  if (value >= INT32_MIN && value <= INT32_MAX) {
    out_ += kBinInt;
    little_endian(out_, static_cast<std::uint32_t>(static_cast<std::int32_t>(value)), 4);
    return;
  }
  out_ += kLong1;  // 8 bytes of two's complement
  out_ += '\x08';
  little_endian(out_, static_cast<std::uint64_t>(value), 8);
}

void PickleWriter::boolean(bool value) { out_ += value ? kNewTrue : kNewFalse; }

std::string PickleWriter::finish() {
  out_ += kStop;
  return std::move(out_);
}

}  // namespace metamem
