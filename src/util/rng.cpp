#include "ddiloco/rng.hpp"

#include <sstream>

#include "ddiloco/error.hpp"

namespace ddiloco {

std::string Rng::state() const {
  std::ostringstream os;
  os << engine_ << ' ' << has_spare_ << ' ' << std::hexfloat << spare_;
  return os.str();
}

void Rng::set_state(const std::string& text) {
  std::istringstream is(text);
  std::mt19937_64 engine;
  bool has_spare = false;
  double spare = 0;
  is >> engine >> has_spare;
  std::string spare_text;
  is >> spare_text;
  if (!is && !is.eof()) fail("random generator state is corrupt");
  spare = std::strtod(spare_text.c_str(), nullptr);
  engine_ = engine;
  has_spare_ = has_spare;
  spare_ = spare;
}

}  // namespace ddiloco
