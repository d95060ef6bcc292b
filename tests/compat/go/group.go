package main

// group-consume: a consumer-group member with the options and JSON-line events of the group
// tests' other members (tests/harness/group_consumer.py, GroupCommands.java), so one scenario
// runs for every client:
//
//	kafscale-franz-go group-consume --bootstrap B --topics T1,T2 --group G [--count N]
//	    [--timeout-ms T] [--assignor range|roundrobin|sticky|cooperative-sticky]
//	    [--instance-id ID] [--commit after-processing|auto|none]
//	    [--auto-offset-reset earliest|latest] [--exit-after-assigned-ms X] [--poll-ms P]
//	    [--config session.timeout.ms=6000 ...] [--config group.protocol=consumer
//	    --config group.remote.assignor=uniform|range]
//
// prints started, assigned / revoked / lost, record, committed / commit-failed, warning and done
// ({"consumed", "reason", "everAssigned"}). SIGTERM (or SIGINT) commits what was processed,
// leaves the group and exits 0.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

type topicPartition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

type partitionOffset struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// member is the bookkeeping every event needs; the mutex serialises output and the pending map
// between the poll loop and kgo's rebalance callbacks.
type member struct {
	mu           sync.Mutex
	client       *kgo.Client
	commit       string
	count        int
	consumed     int
	everAssigned bool
	stopAt       time.Time
	exitAfter    time.Duration
	pending      map[string]map[int32]kgo.EpochOffset // processed, not committed: the next offset
}

func emit(event string, fields map[string]any) {
	line := map[string]any{"event": event}
	for k, v := range fields {
		line[k] = v
	}
	out.Encode(line)
}

func sortedPartitions(assigned map[string][]int32) []topicPartition {
	tps := []topicPartition{}
	for topic, partitions := range assigned {
		for _, p := range partitions {
			tps = append(tps, topicPartition{topic, p})
		}
	}
	sort.Slice(tps, func(i, j int) bool {
		if tps[i].Topic != tps[j].Topic {
			return tps[i].Topic < tps[j].Topic
		}
		return tps[i].Partition < tps[j].Partition
	})
	return tps
}

func (m *member) rebalance(event string, assigned map[string][]int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	tps := sortedPartitions(assigned)
	if event != "assigned" {
		if len(tps) == 0 {
			return // as the other members: an empty revoke or loss is not printed
		}
		for _, tp := range tps {
			delete(m.pending[tp.Topic], tp.Partition)
		}
	} else if len(tps) > 0 && !m.everAssigned {
		m.everAssigned = true
		if m.exitAfter >= 0 {
			m.stopAt = time.Now().Add(m.exitAfter)
		}
	}
	memberID, generation := m.client.GroupMetadata()
	emit(event, map[string]any{"partitions": tps, "memberId": memberID, "generationId": generation})
}

// takePending removes and returns what was processed and not committed, of `only` (nil: all).
func (m *member) takePending(only map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	m.mu.Lock()
	defer m.mu.Unlock()
	taken := map[string]map[int32]kgo.EpochOffset{}
	if m.commit != "after-processing" {
		m.pending = map[string]map[int32]kgo.EpochOffset{}
		return taken
	}
	for topic, partitions := range m.pending {
		for partition, offset := range partitions {
			if only != nil && !contains(only[topic], partition) {
				continue
			}
			if taken[topic] == nil {
				taken[topic] = map[int32]kgo.EpochOffset{}
			}
			taken[topic][partition] = offset
			delete(partitions, partition)
		}
	}
	return taken
}

func contains(partitions []int32, p int32) bool {
	for _, q := range partitions {
		if q == p {
			return true
		}
	}
	return false
}

// commitSync commits `offsets` and prints committed or commit-failed.
func (m *member) commitSync(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) {
	if len(offsets) == 0 {
		return
	}
	var listed []partitionOffset
	for topic, partitions := range offsets {
		for partition, offset := range partitions {
			listed = append(listed, partitionOffset{topic, partition, offset.Offset})
		}
	}
	var failure error
	m.client.CommitOffsetsSync(ctx, offsets,
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				failure = err
				return
			}
			for _, topic := range resp.Topics {
				for _, partition := range topic.Partitions {
					if code := kerr.ErrorForCode(partition.ErrorCode); code != nil && failure == nil {
						failure = code
					}
				}
			}
		})
	m.mu.Lock()
	defer m.mu.Unlock()
	if failure != nil {
		emit("commit-failed", map[string]any{
			"error": fmt.Sprintf("%T", failure), "message": failure.Error(), "offsets": listed,
		})
		return
	}
	emit("committed", map[string]any{"offsets": listed})
}

func (m *member) record(r *kgo.Record) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.count >= 0 && m.consumed >= m.count {
		return false
	}
	emit("record", map[string]any{
		"topic": r.Topic, "partition": r.Partition, "offset": r.Offset,
		"key": textOf(r.Key), "value": textOf(r.Value),
	})
	if m.pending[r.Topic] == nil {
		m.pending[r.Topic] = map[int32]kgo.EpochOffset{}
	}
	m.pending[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
	m.consumed++
	return true
}

func textOf(data []byte) *string {
	if data == nil {
		return nil
	}
	text := strings.ToValidUTF8(string(data), "\uFFFD")
	return &text
}

func balancer(name string) (kgo.GroupBalancer, error) {
	switch name {
	case "range":
		return kgo.RangeBalancer(), nil
	case "roundrobin":
		return kgo.RoundRobinBalancer(), nil
	case "sticky":
		return kgo.StickyBalancer(), nil
	case "cooperative-sticky":
		return kgo.CooperativeStickyBalancer(), nil
	}
	return nil, fmt.Errorf("franz-go has no %q assignor", name)
}

// groupConfigs turns the Java property names the tests pass into kgo options. As in Java,
// group.protocol=consumer (KIP-848) takes group.remote.assignor (uniform or range: kgo sends the
// name of its balancer, StickyBalancer's "uniform" or RangeBalancer's "range") instead of an
// --assignor; kgo falls back to the classic protocol on a broker without ConsumerGroupHeartbeat
// v1, so a test checks the group's type.
func groupConfigs(configs []string, assignor string) ([]kgo.Opt, int, error) {
	var opts []kgo.Opt
	maxPoll := 500
	protocol, remoteAssignor := "classic", ""
	for _, pair := range configs {
		key, value, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, 0, fmt.Errorf("--config %q: want key=value", pair)
		}
		switch key {
		case "group.protocol":
			protocol = value
			continue
		case "group.remote.assignor":
			remoteAssignor = value
			continue
		}
		number, err := strconv.Atoi(value)
		if err != nil {
			return nil, 0, fmt.Errorf("--config %q: want a known property = a number", pair)
		}
		millis := time.Duration(number) * time.Millisecond
		switch key {
		case "session.timeout.ms":
			opts = append(opts, kgo.SessionTimeout(millis))
		case "heartbeat.interval.ms":
			opts = append(opts, kgo.HeartbeatInterval(millis))
		case "max.poll.interval.ms":
			opts = append(opts, kgo.RebalanceTimeout(millis))
		case "max.poll.records":
			maxPoll = number
		default:
			return nil, 0, fmt.Errorf("--config %q: franz-go driver does not know %s", pair, key)
		}
	}
	switch {
	case protocol == "classic" && remoteAssignor == "":
		if assignor != "" {
			chosen, err := balancer(assignor)
			if err != nil {
				return nil, 0, err
			}
			opts = append(opts, kgo.Balancers(chosen))
		}
	case protocol == "classic":
		return nil, 0, fmt.Errorf("group.remote.assignor needs group.protocol=consumer")
	case protocol != "consumer":
		return nil, 0, fmt.Errorf("group.protocol must be classic or consumer, not %q", protocol)
	case assignor != "":
		return nil, 0, fmt.Errorf("--assignor is for group.protocol=classic: use group.remote.assignor")
	default:
		opts = append(opts, kgo.ServerSideBalancer())
		switch remoteAssignor {
		case "", "uniform":
			opts = append(opts, kgo.Balancers(kgo.StickyBalancer()))
		case "range":
			opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
		default:
			return nil, 0, fmt.Errorf("group.remote.assignor must be uniform or range, not %q", remoteAssignor)
		}
	}
	return opts, maxPoll, nil
}

func groupConsume(args []string) error {
	flags := flag.NewFlagSet("group-consume", flag.ExitOnError)
	bootstrap := flags.String("bootstrap", "", "host:port")
	topicList := flags.String("topics", "", "comma-separated topics")
	group := flags.String("group", "", "group id")
	count := flags.Int("count", -1, "stop after this many records (-1: no limit)")
	timeoutMs := flags.Int("timeout-ms", 60000, "stop after this long")
	assignor := flags.String("assignor", "", "range, roundrobin, sticky or cooperative-sticky")
	instanceID := flags.String("instance-id", "", "static membership (KIP-345)")
	commit := flags.String("commit", "after-processing", "after-processing, auto or none")
	reset := flags.String("auto-offset-reset", "earliest", "earliest or latest")
	exitAfter := flags.Int("exit-after-assigned-ms", -1, "stop this long after the first assignment")
	pollMs := flags.Int("poll-ms", 200, "longest wait of one poll")
	var configs stringList
	flags.Var(&configs, "config", "a client property, key=value (repeatable)")
	flags.Parse(args)

	extra, maxPoll, err := groupConfigs(configs, *assignor)
	if err != nil {
		return err
	}
	start := kgo.NewOffset().AtStart()
	if *reset == "latest" {
		start = kgo.NewOffset().AtEnd()
	} else if *reset != "earliest" {
		return fmt.Errorf("--auto-offset-reset must be earliest or latest, not %q", *reset)
	}
	m := &member{
		commit: *commit, count: *count, exitAfter: time.Duration(*exitAfter) * time.Millisecond,
		pending: map[string]map[int32]kgo.EpochOffset{},
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(*bootstrap),
		kgo.ConsumerGroup(*group),
		kgo.ConsumeTopics(strings.Split(*topicList, ",")...),
		kgo.ConsumeResetOffset(start),
		kgo.FetchMaxPartitionBytes(maxBatchBytes),
		kgo.BlockRebalanceOnPoll(), // a rebalance waits until a poll's records are processed
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
			m.rebalance("assigned", assigned)
		}),
		kgo.OnPartitionsRevoked(func(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
			m.commitSync(ctx, m.takePending(revoked))
			m.rebalance("revoked", revoked)
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
			m.rebalance("lost", lost)
		}),
	}
	if *commit != "auto" {
		opts = append(opts, kgo.DisableAutoCommit())
	}
	if *instanceID != "" {
		opts = append(opts, kgo.InstanceID(*instanceID))
	}
	client, err := newClient(append(opts, extra...)...)
	if err != nil {
		return err
	}
	m.client = client
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	emit("started", map[string]any{"group": *group, "topics": strings.Split(*topicList, ",")})

	deadline := time.Now().Add(time.Duration(*timeoutMs) * time.Millisecond)
	reason := ""
	for reason == "" {
		select {
		case <-signals:
			reason = "signal"
			continue
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*pollMs)*time.Millisecond)
		fetches := client.PollRecords(ctx, maxPoll)
		cancel()
		for _, fetchErr := range fetches.Errors() {
			if errors.Is(fetchErr.Err, context.DeadlineExceeded) || errors.Is(fetchErr.Err, context.Canceled) {
				continue
			}
			emit("warning", map[string]any{
				"message": fmt.Sprintf("%s[%d]: %v", fetchErr.Topic, fetchErr.Partition, fetchErr.Err),
			})
		}
		fetches.EachRecord(func(r *kgo.Record) { m.record(r) })
		m.commitSync(context.Background(), m.takePending(nil))
		client.AllowRebalance()
		m.mu.Lock()
		switch {
		case m.count >= 0 && m.consumed >= m.count:
			reason = "count"
		case !m.stopAt.IsZero() && time.Now().After(m.stopAt):
			reason = "assigned-time"
		case time.Now().After(deadline):
			reason = "timeout"
		}
		m.mu.Unlock()
	}
	m.commitSync(context.Background(), m.takePending(nil))
	client.CloseAllowingRebalance() // leaves the group (not for a static member, as Java)
	m.mu.Lock()
	defer m.mu.Unlock()
	emit("done", map[string]any{"consumed": m.consumed, "reason": reason, "everAssigned": m.everAssigned})
	return nil
}
