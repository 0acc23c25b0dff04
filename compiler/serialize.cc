#include "compiler/serialize.h"

#include <cstring>

namespace aspen::compiler {

using graph::AttrValue;
using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::TensorType;
using graph::ValueId;

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

class Writer {
 public:
  template <class T>
  void pod(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void str(std::string_view s) {
    pod<uint64_t>(s.size());
    out_.append(s);
  }
  void type(const TensorType& t) {
    pod<uint8_t>(uint8_t(t.dtype));
    pod<uint8_t>(uint8_t(t.shape.rank()));
    for (int64_t d : t.shape) pod<int64_t>(d);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  size_t offset() const { return pos_; }
  bool done() const { return pos_ == b_.size(); }

  Status fail(const std::string& what) const {
    return Status::error(Code::kCorrupt, "graph encoding at byte " + std::to_string(pos_), what,
                         std::to_string(b_.size() - pos_) + " bytes left");
  }
  template <class T>
  Status pod(T& v) {
    if (b_.size() - pos_ < sizeof(T)) return fail(std::to_string(sizeof(T)) + " more bytes");
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status();
  }
  Status str(std::string& s) {
    uint64_t n = 0;
    ASPEN_RETURN_IF_ERROR(pod(n));
    if (n > b_.size() - pos_) return fail("a string of " + std::to_string(n) + " bytes");
    s.assign(b_.data() + pos_, size_t(n));
    pos_ += size_t(n);
    return Status();
  }
  // A count of items of at least `min_bytes` each: refuse counts the buffer cannot hold.
  Status count(uint64_t& n, size_t min_bytes) {
    ASPEN_RETURN_IF_ERROR(pod(n));
    if (min_bytes && n > (b_.size() - pos_) / min_bytes) return fail("room for " + std::to_string(n) + " items");
    return Status();
  }
  Status type(TensorType& t) {
    uint8_t dt = 0, rank = 0;
    ASPEN_RETURN_IF_ERROR(pod(dt));
    ASPEN_RETURN_IF_ERROR(pod(rank));
    if (dt >= kNumDTypes) return fail("a dtype id below " + std::to_string(kNumDTypes) + ", not " + std::to_string(dt));
    if (rank > Shape::kMaxRank) return fail("a rank <= 8, not " + std::to_string(rank));
    int64_t dims[Shape::kMaxRank];
    for (int i = 0; i < rank; ++i) ASPEN_RETURN_IF_ERROR(pod(dims[i]));
    auto s = Shape::make(dims, rank);
    if (!s.is_ok()) return fail("a valid shape (" + s.status().message() + ")");
    t = TensorType{DType(dt), *s};
    return Status();
  }
  Status bytes(void* dst, size_t n) {
    if (n > b_.size() - pos_) return fail(std::to_string(n) + " bytes of tensor data");
    if (n) std::memcpy(dst, b_.data() + pos_, n);
    pos_ += n;
    return Status();
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

constexpr uint32_t kGraphMagic = 0x48505247;  // "GRPH"

}  // namespace

std::string encode_graph(const Graph& g) {
  Writer w;
  w.pod<uint32_t>(kGraphMagic);
  w.pod<uint64_t>(g.nodes().size());
  for (const Node& n : g.nodes()) {
    w.pod<uint16_t>(uint16_t(n.op));
    w.str(n.name);
    w.pod<int32_t>(n.stage);
    w.pod<uint8_t>(uint8_t((n.checkpoint ? 1 : 0) | (n.backward ? 2 : 0) | (n.scope.empty() ? 0 : 4)));  // flags
    if (!n.scope.empty()) w.str(n.scope);
    w.pod<uint64_t>(n.inputs.size());
    for (ValueId v : n.inputs) w.pod<int32_t>(v.index);
    w.pod<uint64_t>(n.outputs.size());
    for (ValueId v : n.outputs) w.type(g.type(v));
    w.pod<uint64_t>(n.attrs.items().size());
    for (const auto& [key, value] : n.attrs.items()) {
      w.str(key);
      w.pod<uint8_t>(uint8_t(value.index()));
      if (auto* i = std::get_if<int64_t>(&value)) w.pod<int64_t>(*i);
      if (auto* f = std::get_if<double>(&value)) w.pod<double>(*f);
      if (auto* s = std::get_if<std::string>(&value)) w.str(*s);
      if (auto* l = std::get_if<std::vector<int64_t>>(&value)) {
        w.pod<uint64_t>(l->size());
        for (int64_t x : *l) w.pod<int64_t>(x);
      }
    }
    w.pod<uint8_t>(n.constant ? 1 : 0);
    if (n.constant) {
      w.type(TensorType{n.constant->dtype(), n.constant->shape()});
      w.str(std::string_view(static_cast<const char*>(n.constant->raw()), n.constant->nbytes()));
    }
  }
  for (const auto* named : {&g.outputs(), &g.updates()}) {
    w.pod<uint64_t>(named->size());
    for (const auto& [name, v] : *named) {
      w.str(name);
      w.pod<int32_t>(v.index);
    }
  }
  return w.take();
}

Result<Graph> decode_graph(std::string_view bytes) {
  Reader r(bytes);
  uint32_t magic = 0;
  ASPEN_RETURN_IF_ERROR(r.pod(magic));
  if (magic != kGraphMagic) return r.fail("the graph magic number");
  Graph g;
  uint64_t num_nodes = 0;
  ASPEN_RETURN_IF_ERROR(r.count(num_nodes, 20));
  for (uint64_t ni = 0; ni < num_nodes; ++ni) {
    Node n;
    uint16_t op = 0;
    ASPEN_RETURN_IF_ERROR(r.pod(op));
    if (op >= graph::kNumOps) return r.fail("an op number below " + std::to_string(graph::kNumOps));
    n.op = OpKind(op);
    ASPEN_RETURN_IF_ERROR(r.str(n.name));
    ASPEN_RETURN_IF_ERROR(r.pod(n.stage));
    uint8_t ck = 0;
    ASPEN_RETURN_IF_ERROR(r.pod(ck));
    if (ck > 7) return r.fail("node flags 0..7, not " + std::to_string(ck));
    n.checkpoint = (ck & 1) != 0;
    n.backward = (ck & 2) != 0;
    if (ck & 4) ASPEN_RETURN_IF_ERROR(r.str(n.scope));
    uint64_t k = 0;
    ASPEN_RETURN_IF_ERROR(r.count(k, 4));
    for (uint64_t i = 0; i < k; ++i) {
      int32_t v = 0;
      ASPEN_RETURN_IF_ERROR(r.pod(v));
      if (v < 0 || v >= g.num_values()) return r.fail("an input naming an earlier value, not %" + std::to_string(v));
      n.inputs.push_back(ValueId{v});
    }
    std::vector<TensorType> types;
    ASPEN_RETURN_IF_ERROR(r.count(k, 2));
    for (uint64_t i = 0; i < k; ++i) {
      TensorType t;
      ASPEN_RETURN_IF_ERROR(r.type(t));
      types.push_back(t);
    }
    ASPEN_RETURN_IF_ERROR(r.count(k, 9));
    for (uint64_t i = 0; i < k; ++i) {
      std::string key;
      uint8_t tag = 0;
      ASPEN_RETURN_IF_ERROR(r.str(key));
      ASPEN_RETURN_IF_ERROR(r.pod(tag));
      if (tag == 0) {
        int64_t v = 0;
        ASPEN_RETURN_IF_ERROR(r.pod(v));
        n.attrs.set(key, v);
      } else if (tag == 1) {
        double v = 0;
        ASPEN_RETURN_IF_ERROR(r.pod(v));
        n.attrs.set(key, v);
      } else if (tag == 2) {
        std::string v;
        ASPEN_RETURN_IF_ERROR(r.str(v));
        n.attrs.set(key, v);
      } else if (tag == 3) {
        uint64_t m = 0;
        ASPEN_RETURN_IF_ERROR(r.count(m, 8));
        std::vector<int64_t> v(static_cast<size_t>(m));
        for (auto& x : v) ASPEN_RETURN_IF_ERROR(r.pod(x));
        n.attrs.set(key, std::move(v));
      } else {
        return r.fail("an attribute tag 0..3, not " + std::to_string(tag));
      }
    }
    uint8_t has_constant = 0;
    ASPEN_RETURN_IF_ERROR(r.pod(has_constant));
    if (has_constant) {
      TensorType t;
      ASPEN_RETURN_IF_ERROR(r.type(t));
      uint64_t nbytes = 0;
      ASPEN_RETURN_IF_ERROR(r.pod(nbytes));
      auto tensor = Tensor::make(t.dtype, t.shape);
      if (!tensor.is_ok() || nbytes != tensor->nbytes())
        return r.fail("constant data of " + std::to_string(t.bytes()) + " bytes for " + t.to_string());
      ASPEN_RETURN_IF_ERROR(r.bytes(tensor->raw(), size_t(nbytes)));
      n.constant = std::make_shared<const Tensor>(std::move(tensor).value());
    }
    g.add_node(std::move(n), types);
  }
  // Named outputs, then updates: a count, then (name, value index) pairs.
  for (const bool updates : {false, true}) {
    uint64_t count = 0;
    ASPEN_RETURN_IF_ERROR(r.count(count, 12));
    for (uint64_t i = 0; i < count; ++i) {
      std::string name;
      int32_t v = 0;
      ASPEN_RETURN_IF_ERROR(r.str(name));
      ASPEN_RETURN_IF_ERROR(r.pod(v));
      if (v < 0 || v >= g.num_values())
        return r.fail(std::string(updates ? "an update" : "an output") + " naming a value, not %" + std::to_string(v));
      if (updates)
        g.add_update(std::move(name), ValueId{v});
      else
        g.add_output(std::move(name), ValueId{v});
    }
  }
  if (!r.done()) return r.fail("the end of the encoding");
  return g;
}

}  // namespace aspen::compiler
