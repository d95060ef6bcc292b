// Command kafscale-franz-go is the franz-go (github.com/twmb/franz-go/pkg/kgo) driver of KafScale's
// client compatibility tests (tests/harness/franz_go.py). Bytes travel as base64 in JSON lines.
//
//	kafscale-franz-go produce --bootstrap B --topic T --codec none|gzip|snappy|lz4|zstd < records
//	    stdin:  {"partition":0,"key_b64":"..."|null,"value_b64":"...","headers":[["name","b64"]],"timestamp":ms|null}
//	    stdout: {"partition":0,"offset":42} per record, in input order, once all are acknowledged
//	kafscale-franz-go consume --bootstrap B --topics T1,T2 --partitions 0,1,2 \
//	        --start earliest|latest|MS --count N --timeout-ms MS
//	    stdout: {"ready":true} once every position is fixed, then one line per record
//	    {"topic":..,"partition":..,"offset":..,"key_b64":..,"value_b64":..,"headers":[[..]],"timestamp":ms},
//	    then {"done":true} after N records or the timeout.
//
//	kafscale-franz-go group-consume ...   a consumer-group member (group.go)
//	kafscale-franz-go admin ...           create and describe with pkg/kadm (admin.go)
//
// Every client connects as the environment says (security.go; unset: plaintext, as before):
// KAFSCALE_DRIVER_SECURITY_PROTOCOL (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL),
// KAFSCALE_DRIVER_CA_FILE, KAFSCALE_DRIVER_SASL_MECHANISM (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN),
// KAFSCALE_DRIVER_SASL_USERNAME, KAFSCALE_DRIVER_SASL_PASSWORD.
//
// Errors go to stderr and make the exit status 1.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// maxBatchBytes lets a batch hold a 1 MiB value plus key and headers (the topics' max.message.bytes
// is 2 MiB; kgo counts uncompressed bytes, so a compressed batch is never larger).
const maxBatchBytes = 2 << 20

type inRecord struct {
	Partition int32       `json:"partition"`
	Key       *string     `json:"key_b64"`
	Value     *string     `json:"value_b64"`
	Headers   [][2]string `json:"headers"`
	Timestamp *int64      `json:"timestamp"`
}

type outRecord struct {
	Topic     string       `json:"topic"`
	Partition int32        `json:"partition"`
	Offset    int64        `json:"offset"`
	Key       *string      `json:"key_b64"`
	Value     *string      `json:"value_b64"`
	Headers   [][2]*string `json:"headers"`
	Timestamp int64        `json:"timestamp"`
}

var out = json.NewEncoder(os.Stdout) // unbuffered: each line is written at once

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: kafscale-franz-go produce|consume|group-consume|admin [flags]"))
	}
	var err error
	switch os.Args[1] {
	case "produce":
		err = produce(os.Args[2:])
	case "consume":
		err = consume(os.Args[2:])
	case "group-consume":
		err = groupConsume(os.Args[2:])
	case "admin":
		err = admin(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kafscale-franz-go:", err)
	os.Exit(1)
}

// decode turns base64 (JSON null: nil) into bytes; "" gives a non-nil empty slice, which kgo
// writes as a zero-length key or value, not as null.
func decode(text *string) ([]byte, error) {
	if text == nil {
		return nil, nil
	}
	data, err := base64.StdEncoding.DecodeString(*text)
	if data == nil && err == nil {
		data = []byte{}
	}
	return data, err
}

func encode(data []byte) *string {
	if data == nil {
		return nil
	}
	text := base64.StdEncoding.EncodeToString(data)
	return &text
}

func compression(codec string) (kgo.CompressionCodec, error) {
	switch codec {
	case "none":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("unknown codec %q", codec)
}

func readRecords(topic string) ([]*kgo.Record, error) {
	var records []*kgo.Record
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(nil, 64<<20)
	for scanner.Scan() {
		var in inRecord
		if err := json.Unmarshal(scanner.Bytes(), &in); err != nil {
			return nil, fmt.Errorf("record #%d: %w", len(records), err)
		}
		key, err := decode(in.Key)
		if err != nil {
			return nil, err
		}
		value, err := decode(in.Value)
		if err != nil {
			return nil, err
		}
		record := &kgo.Record{Topic: topic, Partition: in.Partition, Key: key, Value: value}
		for _, header := range in.Headers {
			headerValue, err := decode(&header[1])
			if err != nil {
				return nil, err
			}
			record.Headers = append(record.Headers, kgo.RecordHeader{Key: header[0], Value: headerValue})
		}
		if in.Timestamp != nil { // else kgo stamps the time of producing
			record.Timestamp = time.UnixMilli(*in.Timestamp)
		}
		records = append(records, record)
	}
	return records, scanner.Err()
}

func produce(args []string) error {
	flags := flag.NewFlagSet("produce", flag.ExitOnError)
	bootstrap := flags.String("bootstrap", "", "host:port")
	topic := flags.String("topic", "", "topic")
	codec := flags.String("codec", "none", "none, gzip, snappy, lz4 or zstd")
	timeout := flags.Duration("timeout", 60*time.Second, "for all acknowledgements")
	flags.Parse(args)
	compressor, err := compression(*codec)
	if err != nil {
		return err
	}
	records, err := readRecords(*topic)
	if err != nil {
		return err
	}
	client, err := newClient(
		kgo.SeedBrokers(*bootstrap),
		kgo.RequiredAcks(kgo.AllISRAcks()), // the default; idempotence stays on (the default)
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(compressor),
		kgo.ProducerBatchMaxBytes(maxBatchBytes),
		kgo.ProducerLinger(5*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(records))
	for i, record := range records {
		wg.Add(1)
		client.Produce(ctx, record, func(_ *kgo.Record, err error) {
			errs[i] = err
			wg.Done()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	for _, record := range records {
		out.Encode(map[string]any{"partition": record.Partition, "offset": record.Offset})
	}
	return nil
}

// positions resolves where each partition starts, before consuming: exact offsets, so the
// positions are fixed once the consuming client exists.
func positions(bootstrap string, topics []string, partitions []int32, start string) (map[string]map[int32]kgo.Offset, error) {
	client, err := newClient(kgo.SeedBrokers(bootstrap))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	admin := kadm.NewClient(client)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var listed kadm.ListedOffsets
	switch start {
	case "earliest":
		listed, err = admin.ListStartOffsets(ctx, topics...)
	case "latest":
		listed, err = admin.ListEndOffsets(ctx, topics...)
	default:
		millis, parseErr := strconv.ParseInt(start, 10, 64)
		if parseErr != nil {
			return nil, fmt.Errorf("--start must be earliest, latest or a timestamp in ms: %w", parseErr)
		}
		// The first offset at or after the timestamp; a partition without one: its end.
		listed, err = admin.ListOffsetsAfterMilli(ctx, millis, topics...)
	}
	if err != nil {
		return nil, fmt.Errorf("list offsets (%s): %w", start, err)
	}
	offsets := make(map[string]map[int32]kgo.Offset)
	for _, topic := range topics {
		offsets[topic] = make(map[int32]kgo.Offset)
		for _, partition := range partitions {
			at, ok := listed.Lookup(topic, partition)
			if !ok {
				return nil, fmt.Errorf("list offsets (%s): no answer for %s[%d]", start, topic, partition)
			}
			if at.Err != nil {
				return nil, fmt.Errorf("list offsets (%s) %s[%d]: %w", start, topic, partition, at.Err)
			}
			offsets[topic][partition] = kgo.NewOffset().At(at.Offset)
		}
	}
	return offsets, nil
}

func consume(args []string) error {
	flags := flag.NewFlagSet("consume", flag.ExitOnError)
	bootstrap := flags.String("bootstrap", "", "host:port")
	topicList := flags.String("topics", "", "comma-separated topics")
	partitionList := flags.String("partitions", "", "comma-separated partitions of every topic")
	start := flags.String("start", "earliest", "earliest, latest or a timestamp in ms")
	count := flags.Int("count", 0, "stop after this many records")
	timeoutMs := flags.Int("timeout-ms", 60000, "stop after this long")
	flags.Parse(args)
	deadline := time.Now().Add(time.Duration(*timeoutMs) * time.Millisecond)
	topics := strings.Split(*topicList, ",")
	var partitions []int32
	for _, text := range strings.Split(*partitionList, ",") {
		partition, err := strconv.ParseInt(text, 10, 32)
		if err != nil {
			return fmt.Errorf("--partitions: %w", err)
		}
		partitions = append(partitions, int32(partition))
	}
	offsets, err := positions(*bootstrap, topics, partitions, *start)
	if err != nil {
		return err
	}
	client, err := newClient(
		kgo.SeedBrokers(*bootstrap),
		kgo.ConsumePartitions(offsets), // direct assignment: no group, nothing committed
		kgo.FetchMaxPartitionBytes(maxBatchBytes),
	)
	if err != nil {
		return err
	}
	defer client.Close()
	out.Encode(map[string]bool{"ready": true})
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for received := 0; received < *count && ctx.Err() == nil; {
		fetches := client.PollFetches(ctx)
		for _, fetchErr := range fetches.Errors() {
			if errors.Is(fetchErr.Err, context.DeadlineExceeded) || kerr.IsRetriable(fetchErr.Err) {
				continue // the deadline, or an error kgo retries by itself
			}
			return fmt.Errorf("fetch %s[%d]: %w", fetchErr.Topic, fetchErr.Partition, fetchErr.Err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			headers := make([][2]*string, 0, len(r.Headers))
			for _, header := range r.Headers {
				name := header.Key
				headers = append(headers, [2]*string{&name, encode(header.Value)})
			}
			out.Encode(outRecord{
				Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				Key: encode(r.Key), Value: encode(r.Value), Headers: headers,
				Timestamp: r.Timestamp.UnixMilli(),
			})
			received++
		})
	}
	out.Encode(map[string]bool{"done": true})
	return nil
}
