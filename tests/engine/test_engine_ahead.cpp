// The engine tests of test_engine.cpp again with scheduling ahead forced on
// (EngineConfig::schedule_ahead = 1): the fake model's greedy passes then go through
// Model::begin_greedy's default, each begun one step before its ids are read, and every oracle
// must still hold.
#define PAGEDATTN_ENGINE_SUITE EngineScheduledAhead
#define PAGEDATTN_ASYNC_SUITE AsyncEngineScheduledAhead
#define PAGEDATTN_SCHEDULE_AHEAD 1
#include "test_engine.cpp"  // NOLINT(bugprone-suspicious-include)
