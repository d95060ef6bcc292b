package main

// admin: what an operator does with franz-go's admin client (pkg/kadm), printed as one JSON object:
//
//	kafscale-franz-go admin --bootstrap B --topic T --partitions N [--config k=v ...] [--group G]
//
// creates T with N partitions and the configs, creates it again (the error is printed), then
// describes the cluster, the topic, the topic's configs and (with --group) the group and its
// committed offsets:
//
//	{"created": null|"ERROR", "created_again": "TOPIC_ALREADY_EXISTS",
//	 "cluster": {"controller": 0, "brokers": [{"id": 0, "host": "...", "port": 9092}]},
//	 "topic": {"partitions": [{"partition": 0, "leader": 0, "replicas": [0]}]},
//	 "configs": {"retention.ms": {"value": "...", "source": "DYNAMIC_TOPIC_CONFIG"}},
//	 "group": {"state": "Empty", "protocol_type": "consumer", "members": 0},
//	 "offsets": [{"topic": "...", "partition": 0, "offset": 10}]}

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// errorName is Kafka's name of an error (TOPIC_ALREADY_EXISTS), nil for none.
func errorName(err error) *string {
	if err == nil {
		return nil
	}
	var kafkaErr *kerr.Error
	name := err.Error()
	if errors.As(err, &kafkaErr) {
		name = kafkaErr.Message
	}
	return &name
}

func admin(args []string) error {
	flags := flag.NewFlagSet("admin", flag.ExitOnError)
	bootstrap := flags.String("bootstrap", "", "host:port")
	topic := flags.String("topic", "", "the topic to create and describe")
	partitions := flags.Int("partitions", 1, "its partition count")
	group := flags.String("group", "", "a group to describe")
	var configs stringList
	flags.Var(&configs, "config", "a topic config, key=value (repeatable)")
	flags.Parse(args)

	client, err := newClient(kgo.SeedBrokers(*bootstrap))
	if err != nil {
		return err
	}
	defer client.Close()
	adm := kadm.NewClient(client)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	result := map[string]any{}

	topicConfigs := map[string]*string{}
	var keys []string
	for _, pair := range configs {
		key, value, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Errorf("--config %q: want key=value", pair)
		}
		topicConfigs[key] = &value
		keys = append(keys, key)
	}
	for _, field := range []string{"created", "created_again"} {
		created, err := adm.CreateTopic(ctx, int32(*partitions), 1, topicConfigs, *topic)
		if err == nil {
			err = created.Err
		}
		result[field] = errorName(err)
	}

	metadata, err := adm.Metadata(ctx, *topic)
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	brokers := []map[string]any{}
	for _, b := range metadata.Brokers {
		brokers = append(brokers, map[string]any{"id": b.NodeID, "host": b.Host, "port": b.Port})
	}
	result["cluster"] = map[string]any{"controller": metadata.Controller, "brokers": brokers}
	detail, ok := metadata.Topics[*topic]
	if !ok {
		return fmt.Errorf("metadata: no topic %s", *topic)
	}
	if detail.Err != nil {
		return fmt.Errorf("metadata %s: %w", *topic, detail.Err)
	}
	described := []map[string]any{}
	for _, p := range detail.Partitions.Sorted() {
		described = append(described, map[string]any{
			"partition": p.Partition, "leader": p.Leader, "replicas": p.Replicas,
		})
	}
	result["topic"] = map[string]any{"partitions": described}

	configsOf, err := adm.DescribeTopicConfigs(ctx, *topic)
	if err != nil {
		return fmt.Errorf("describe configs: %w", err)
	}
	resource, err := configsOf.On(*topic, nil)
	if err == nil {
		err = resource.Err
	}
	if err != nil {
		return fmt.Errorf("describe configs %s: %w", *topic, err)
	}
	values := map[string]any{}
	for _, c := range resource.Configs {
		values[c.Key] = map[string]any{"value": c.Value, "source": c.Source.String()}
	}
	result["configs"] = values

	if *group != "" {
		groups, err := adm.DescribeGroups(ctx, *group)
		if err != nil {
			return fmt.Errorf("describe group: %w", err)
		}
		g := groups[*group]
		if g.Err != nil {
			return fmt.Errorf("describe group %s: %w", *group, g.Err)
		}
		result["group"] = map[string]any{
			"state": g.State, "protocol_type": g.ProtocolType, "members": len(g.Members),
		}
		fetched, err := adm.FetchOffsets(ctx, *group)
		if err != nil {
			return fmt.Errorf("fetch offsets: %w", err)
		}
		offsets := []partitionOffset{}
		for _, o := range fetched.Sorted() {
			if o.Err != nil {
				return fmt.Errorf("fetch offsets %s[%d]: %w", o.Topic, o.Partition, o.Err)
			}
			offsets = append(offsets, partitionOffset{o.Topic, o.Partition, o.At})
		}
		sort.Slice(offsets, func(i, j int) bool { return offsets[i].Partition < offsets[j].Partition })
		result["offsets"] = offsets
	}
	return out.Encode(result)
}
