#include "parallel/mesh.h"

#include <gtest/gtest.h>

namespace aspen::parallel {
namespace {

TEST(Mesh, CoordinatesAndRanksRoundTrip) {
  Mesh m = Mesh::create({2, 3, 4}, 24).value();
  EXPECT_EQ(m.size(), 24);
  for (int r = 0; r < m.size(); ++r) EXPECT_EQ(m.rank(m.coord(r)), r);
  EXPECT_EQ(m.coord(0), (Coord{0, 0, 0}));
  EXPECT_EQ(m.coord(1), (Coord{0, 0, 1}));  // tensor varies fastest
  EXPECT_EQ(m.coord(4), (Coord{0, 1, 0}));
  EXPECT_EQ(m.coord(12), (Coord{1, 0, 0}));
  EXPECT_EQ(m.coord(23), (Coord{1, 2, 3}));
}

TEST(Mesh, GroupsAlongEachAxis) {
  Mesh m = Mesh::create({2, 1, 2}).value();
  EXPECT_EQ(m.groups(Axis::data), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(m.groups(Axis::tensor), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(m.groups(Axis::pipe), (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}));
  Mesh p = Mesh::create({2, 3, 2}).value();
  EXPECT_EQ(p.group(Axis::pipe, 7), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(p.group(Axis::data, 7), (std::vector<int>{1, 7}));
  // Every device is in exactly one group per axis, at its coordinate.
  for (Axis a : kAxes) {
    std::vector<int> seen(static_cast<size_t>(p.size()), 0);
    for (const auto& g : p.groups(a)) {
      EXPECT_EQ(int(g.size()), p.axis_size(a));
      for (size_t i = 0; i < g.size(); ++i) {
        ++seen[static_cast<size_t>(g[i])];
        EXPECT_EQ(p.coord(g[i])[a], int(i));
      }
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

TEST(Mesh, SizesThatDoNotMultiplyToTheDeviceCount) {
  auto m = Mesh::create({2, 2, 2}, 6);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(m.status().message(),
            "mesh data=2 x pipe=2 x tensor=2: expected 6 devices (data x pipe x tensor = the device count), "
            "found 2 x 2 x 2 = 8 (hint: choose axis sizes whose product is 6)");
}

TEST(Mesh, ZeroAndNegativeSizes) {
  auto z = Mesh::create({2, 0, 1});
  ASSERT_FALSE(z.is_ok());
  EXPECT_EQ(z.status().message(),
            "mesh axis 'pipe': expected a size >= 1, found 0 (hint: mesh data=2 x pipe=0 x tensor=1)");
  auto neg = Mesh::create({1, 1, -2}, 2);
  ASSERT_FALSE(neg.is_ok());
  EXPECT_NE(neg.status().message().find("mesh axis 'tensor': expected a size >= 1, found -2"), std::string::npos);
  auto dev = Mesh::create({1, 1, 1}, 0);
  ASSERT_FALSE(dev.is_ok());
  EXPECT_EQ(dev.status().message(), "device count: expected a count >= 1, found 0");
}

}  // namespace
// A job's placement: whole replicas per process, or the model across processes (one device each), and
// the shapes that fit neither named with the counts that would.
TEST(Placement, WholeReplicasOrTheModelAcrossProcesses) {
  auto one = place({.data = 4, .pipe = 2, .tensor = 1}, 1, "replicas");
  ASSERT_TRUE(one.is_ok());
  EXPECT_FALSE(one->across);
  EXPECT_EQ(one->local_replicas(), 4);
  EXPECT_EQ(one->process_devices(), 8);
  EXPECT_EQ(one->replica(0, 3), 3);
  auto two = place({.data = 4, .pipe = 1, .tensor = 2}, 2, "replicas");
  ASSERT_TRUE(two.is_ok());
  EXPECT_FALSE(two->across);
  EXPECT_EQ(two->local_replicas(), 2);
  EXPECT_EQ(two->replica(1, 0), 2);
  EXPECT_EQ(two->replica(1, 1), 3);
  auto across = place({.data = 2, .pipe = 2, .tensor = 2}, 8, "replicas");
  ASSERT_TRUE(across.is_ok());
  EXPECT_TRUE(across->across);
  EXPECT_EQ(across->local_replicas(), 1);
  EXPECT_EQ(across->process_devices(), 1);
  EXPECT_EQ(across->replica(5, 0), 1);  // processes 4..7 hold replica 1's four devices
  EXPECT_EQ(place({.data = 3, .pipe = 2, .tensor = 1}, 4, "config: batch.replicas").status().message(),
            "config: batch.replicas: expected a multiple of the 4 processes of this MPI job, or with the model across "
            "processes, replicas x stages x shards (2) = 4, found 3 (hint: --replicas 4 (whole replicas per process) "
            "or --replicas 2 (the model across processes))");
  EXPECT_EQ(place({.data = 1, .pipe = 1, .tensor = 1}, 0, "r").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(default_replicas(1, 1, 4), 4);  // a replica per process
  EXPECT_EQ(default_replicas(2, 1, 4), 2);  // the model across processes
  EXPECT_EQ(default_replicas(2, 2, 6), 6);  // 4 devices do not divide 6 processes
  EXPECT_EQ(default_replicas(2, 2, 1), 1);
}

}  // namespace aspen::parallel
