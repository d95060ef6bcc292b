import pathlib

import pytest

from kafscale import config as configuration
from kafscale.config import ConfigError, MiB, load, parse_size

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_defaults() -> None:
    config = load({})
    assert config.broker_port == 9092
    assert config.metrics_port == 9093
    assert config.s3_namespace == "default"
    assert config.segment_bytes == 4 * MiB
    assert config.flush_interval_ms == 0  # auto
    assert config.flush_interval == 50  # the local store
    assert config.cache_size == 1024 * MiB
    assert config.index_cache_size == 256 * MiB
    assert config.readahead_segments == 2
    assert config.max_request_bytes == 100 * MiB
    assert config.auto_create_topics is True
    assert config.auto_create_partitions == 1
    assert config.compression_codec == "snappy"
    assert config.shards >= 1
    assert not config.uses_s3 and not config.uses_etcd


def test_environment_and_flags() -> None:
    env = {
        "KAFSCALE_BROKER_PORT": "19092",
        "KAFSCALE_SHARDS": "3",
        "KAFSCALE_ETCD_ENDPOINTS": "127.0.0.1:2379, 10.0.0.2:2379",
        "KAFSCALE_S3_BUCKET": "b",
        "KAFSCALE_S3_ENDPOINT": "http://127.0.0.1:9000",
        "KAFSCALE_S3_PATH_STYLE": "true",
        "KAFSCALE_SEGMENT_BYTES": "8MiB",
    }
    config = load(env, {"shards": "5", "broker_port": None})
    assert config.broker_port == 19092
    assert config.shards == 5  # the flag wins
    assert config.etcd_endpoints == ("127.0.0.1:2379", "10.0.0.2:2379")
    assert config.uses_s3 and config.uses_etcd and config.s3_path_style
    assert config.segment_bytes == 8 * MiB


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KAFSCALE_BROKER_PORT", "70000"),
        ("KAFSCALE_BROKER_PORT", "http"),
        ("KAFSCALE_SHARDS", "0"),
        ("KAFSCALE_SEGMENT_BYTES", "4 potatoes"),
        ("KAFSCALE_SEGMENT_BYTES", "12"),
        ("KAFSCALE_AUTO_CREATE_TOPICS", "maybe"),
        ("KAFSCALE_COMPRESSION_CODEC", "gzip2"),
        ("KAFSCALE_LOG_LEVEL", "loud"),
        ("KAFSCALE_ETCD_ENDPOINTS", "no-port"),
        ("KAFSCALE_S3_ENDPOINT", "ftp://x:1"),
        ("KAFSCALE_S3_NAMESPACE", "a/b"),
        ("KAFSCALE_FLUSH_INTERVAL_MS", "-1"),
    ],
)
def test_invalid_values_name_the_variable(variable: str, value: str) -> None:
    env = {variable: value}
    if variable == "KAFSCALE_S3_ENDPOINT":
        env["KAFSCALE_S3_BUCKET"] = "b"
    with pytest.raises(ConfigError, match=variable):
        load(env)


def test_invalid_flag_names_flag_and_variable() -> None:
    with pytest.raises(ConfigError, match=r"--broker-port.*KAFSCALE_BROKER_PORT"):
        load({}, {"broker_port": "-3"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KAFSCALE_S3_ENDPOINT": "http://127.0.0.1:9000"}, "KAFSCALE_S3_BUCKET"),
        ({"KAFSCALE_S3_ACCESS_KEY": "a"}, "KAFSCALE_S3_SECRET_KEY"),
        ({"KAFSCALE_METRICS_PORT": "9092"}, "KAFSCALE_METRICS_PORT"),
    ],
)
def test_inconsistent_settings(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(env)


@pytest.mark.parametrize(
    ("text", "size"),
    [("1024", 1024), ("4MiB", 4 * MiB), ("1GB", 1024 * MiB), ("256mb", 256 * MiB), ("10k", 10240)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_secrets_are_masked_in_the_logged_configuration() -> None:
    config = load(
        {
            "KAFSCALE_S3_ACCESS_KEY": "AKIAEXAMPLE",
            "KAFSCALE_S3_SECRET_KEY": "hunter2",
            "KAFSCALE_ADMIN_TOKEN": "t0ken-t0ken-t0ken",
        }
    )
    public = config.public_dict()
    assert public["s3_secret_key"] == public["s3_access_key"] == public["admin_token"] == "***"
    for secret in ("AKIAEXAMPLE", "hunter2", "t0ken-t0ken-t0ken"):
        assert secret not in repr(public)
        assert secret not in repr(config)  # a Config in a traceback or a log says nothing either
    assert set(config.secret_values()) == {"AKIAEXAMPLE", "hunter2", "t0ken-t0ken-t0ken"}
    assert load({}).secret_values() == ()


def test_credentials_are_settings_without_a_flag() -> None:
    secret = {s.env for s in configuration.SETTINGS if s.secret}
    assert secret == {
        "KAFSCALE_S3_ACCESS_KEY",
        "KAFSCALE_S3_SECRET_KEY",
        "KAFSCALE_ADMIN_TOKEN",
        "KAFSCALE_ETCD_KEY",
        "KAFSCALE_ETCD_PASSWORD",
        "KAFSCALE_SSL_KEY_PASSWORD",
        "KAFSCALE_SASL_ADMIN_PASSWORD",
        "KAFSCALE_METRICS_PASSWORD",
    }
    for field in (
        "s3_access_key",
        "s3_secret_key",
        "admin_token",
        "etcd_key",
        "etcd_password",
        "ssl_key_password",
        "sasl_admin_password",
        "metrics_password",
    ):
        with pytest.raises(ConfigError, match=r"is not accepted.*_FILE") as refused:
            load({}, {field: "exposed-value"})
        assert "exposed-value" not in str(refused.value)


def test_a_credential_comes_from_the_file_its_file_variable_names(tmp_path: pathlib.Path) -> None:
    secret_file = tmp_path / "secret-key"
    secret_file.write_text("from-a-file\n")  # as `echo` writes it: the newline is not the key
    config = load(
        {"KAFSCALE_S3_ACCESS_KEY": "AKIAEXAMPLE", "KAFSCALE_S3_SECRET_KEY_FILE": str(secret_file)}
    )
    assert config.s3_secret_key == "from-a-file"
    assert configuration.unknown_variables({"KAFSCALE_S3_SECRET_KEY_FILE": "x"}) == []
    assert configuration.unknown_variables({"KAFSCALE_BROKER_PORT_FILE": "x"}) == [
        "KAFSCALE_BROKER_PORT_FILE"  # only credentials have a _FILE variable
    ]


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        ("both", "KAFSCALE_S3_SECRET_KEY and KAFSCALE_S3_SECRET_KEY_FILE are both set"),
        ("missing", "cannot read KAFSCALE_S3_SECRET_KEY_FILE=.*No such file"),
        ("empty", "KAFSCALE_S3_SECRET_KEY_FILE=.* names an empty file"),
        ("binary", "KAFSCALE_S3_SECRET_KEY_FILE=.* is not UTF-8 text"),
    ],
)
def test_a_bad_credential_file_is_refused(
    tmp_path: pathlib.Path, problem: str, message: str
) -> None:
    path = tmp_path / "secret-key"
    env = {"KAFSCALE_S3_ACCESS_KEY": "AKIAEXAMPLE", "KAFSCALE_S3_SECRET_KEY_FILE": str(path)}
    if problem == "both":
        path.write_text("in-the-file")
        env["KAFSCALE_S3_SECRET_KEY"] = "in-the-environment"
    elif problem == "empty":
        path.write_text("\n")
    elif problem == "binary":
        path.write_bytes(b"\xff\xfe-in-the-file")
    with pytest.raises(ConfigError, match=message) as refused:
        load(env)
    assert "in-the-" not in str(refused.value)


def test_errors_never_quote_a_credential() -> None:
    with pytest.raises(ConfigError, match=r"KAFSCALE_ADMIN_TOKEN.*at least 16") as short:
        load({"KAFSCALE_ADMIN_TOKEN": "short-tok"})
    assert "short-tok" not in str(short.value)
    with pytest.raises(ConfigError, match=r"KAFSCALE_S3_ENDPOINT.*credentials in the URL") as url:
        load({"KAFSCALE_S3_BUCKET": "b", "KAFSCALE_S3_ENDPOINT": "http://user:pa55@minio:9000"})
    assert "pa55" not in str(url.value)
    with pytest.raises(ConfigError, match=r"KAFSCALE_ETCD_ENDPOINTS.*credentials") as etcd:
        load({"KAFSCALE_ETCD_ENDPOINTS": "etcd-0:2379,http://root:pa55@etcd-1:2379"})
    assert "pa55" not in str(etcd.value)


def test_config_survives_the_trip_to_the_children() -> None:
    config = load({"KAFSCALE_ETCD_ENDPOINTS": "127.0.0.1:2379"})
    assert configuration.Config.from_json_dict(config.to_json_dict()) == config


def test_unknown_variables_are_reported() -> None:
    assert configuration.unknown_variables({"KAFSCALE_BROKER_PROT": "1", "HOME": "/"}) == [
        "KAFSCALE_BROKER_PROT"
    ]


def test_wildcard_bind_advertises_a_connectable_host() -> None:
    assert load({"KAFSCALE_BROKER_HOST": "0.0.0.0"}).advertised_listener_host != "0.0.0.0"
    assert (
        load({"KAFSCALE_ADVERTISED_HOST": "kafka.example"}).advertised_listener_host
        == "kafka.example"
    )


def test_readme_configuration_table_is_the_settings_table() -> None:
    assert configuration.markdown_table() in README.read_text()


def test_broker_id_is_a_number_an_ordinal_or_auto() -> None:
    from kafscale.settings import AUTO_BROKER_ID, parse_broker_id

    assert parse_broker_id("7") == 7
    assert parse_broker_id("auto") == AUTO_BROKER_ID
    assert parse_broker_id("ordinal", hostname="kafscale-12") == 12
    assert parse_broker_id("ordinal", hostname="kafscale-3.kafscale-headless.ns.svc") == 3
    wrong_ones = (("ordinal", "broker"), ("ordinal", "kafscale-x"), ("-1", None), ("x", None))
    for wrong, host in wrong_ones:
        with pytest.raises(ValueError):
            parse_broker_id(wrong, hostname=host)
