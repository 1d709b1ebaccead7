"""Feature extractors ("torsos") and the shared policy/baseline head.

Torsos map a batch of observations [N, ...] to features [N, H]; they have no time dimension.
Agents merge [T, B] into N = T * B to run a torso over a whole unroll at once.
"""

import sonnet as snt
import tensorflow as tf

from networks.base import AgentOutput


def scale_pixels(observation: tf.Tensor) -> tf.Tensor:
    """Maps raw pixel values in [0, 255] (any dtype, usually uint8) to float32 in [0, 1].

    Done inside the network so that actors can ship compact uint8 frames.
    """
    return tf.cast(observation, tf.float32) / 255.0


def relu_orthogonal() -> snt.initializers.Initializer:
    """Orthogonal weights with gain sqrt(2), the usual start for ReLU layers in Atari agents.

    Sonnet's default (a truncated normal of variance 1 / fan-in) halves the activations' second
    moment at every ReLU: the shallow torso then starts with features 2 to 9 times smaller on
    Pong frames (three seeds, `benchmarks/probe_network.py`), and with Adam or RMSProp, whose
    steps are a learning rate per weight, the policy moves that much slower per step.
    """
    return snt.initializers.Orthogonal(gain=2**0.5)


# The precisions a conv-stack torso computes in (`--compute_dtype`); its weights are float32.
COMPUTE_DTYPES = ("float32", "bfloat16")


class ConvStackTorso(snt.Module):
    """VALID convolutions with ReLU, then one fully connected ReLU layer.

    Maps raw pixels [N, H, W, C] to features [N, hidden_size] (float32). Weights start
    orthogonal with gain sqrt(2) (`relu_orthogonal`), biases at 0. Its weights are float32; with
    `compute_dtype` "bfloat16" its layers compute on bfloat16 copies of them and of their inputs
    (oneDNN's bfloat16 kernels, on CPUs that have them), their outputs cast back to float32.
    """

    def __init__(
        self,
        convs: tuple[tuple[int, int, int], ...],
        hidden_size: int,
        compute_dtype: str = "float32",
        name: str | None = None,
    ):
        """Args: convs: (channels, kernel size, stride) of each convolution, in order;
        compute_dtype: one of `COMPUTE_DTYPES`."""
        super().__init__(name=name)
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"--compute_dtype={compute_dtype}: must be float32 or bfloat16")
        self._compute_dtype = tf.as_dtype(compute_dtype)
        self._convs = [
            snt.Conv2D(
                channels,
                kernel,
                stride=stride,
                padding="VALID",
                w_init=relu_orthogonal(),
                name=f"conv_{index}",
            )
            for index, (channels, kernel, stride) in enumerate(convs)
        ]
        self._linear = snt.Linear(hidden_size, w_init=relu_orthogonal())

    def __call__(self, observation: tf.Tensor, extra: tf.Tensor | None = None) -> tf.Tensor:
        """Maps `observation` [N, H, W, C] (and `extra` float32 [N, E], if given, joined to the
        convolutions' flattened output before the fully connected layer) to [N, hidden_size].
        """
        if self._compute_dtype != tf.float32:
            return self._in_low_precision(observation, extra)
        return self._float32_call(observation, extra)

    def _in_low_precision(self, observation: tf.Tensor, extra: tf.Tensor | None) -> tf.Tensor:
        """`__call__` computed in `self._compute_dtype` from the float32 weights."""
        if not hasattr(self._linear, "w"):
            # The weights are made float32, from one float32 frame, before any is cast.
            self._float32_call(observation[:1], None if extra is None else extra[:1])
        dtype = self._compute_dtype
        x = tf.cast(scale_pixels(observation), dtype)
        for conv in self._convs:
            x = tf.nn.convolution(
                x,
                tf.cast(conv.w, dtype),
                strides=conv.stride,
                padding=conv.conv_padding,
                dilations=conv.rate,
                data_format=conv.data_format,
            )
            x = tf.nn.relu(tf.nn.bias_add(x, tf.cast(conv.b, dtype)))
        x = snt.Flatten()(x)
        if extra is not None:
            x = tf.concat([x, tf.cast(extra, dtype)], axis=-1)
        x = tf.matmul(x, tf.cast(self._linear.w, dtype)) + tf.cast(self._linear.b, dtype)
        return tf.cast(tf.nn.relu(x), tf.float32)

    def _float32_call(self, observation: tf.Tensor, extra: tf.Tensor | None) -> tf.Tensor:
        x = scale_pixels(observation)
        for conv in self._convs:
            x = tf.nn.relu(conv(x))
        x = snt.Flatten()(x)
        if extra is not None:
            x = tf.concat([x, extra], axis=-1)
        return tf.nn.relu(self._linear(x))


class DQNTorso(ConvStackTorso):
    """Nature-DQN torso (Mnih et al. 2015): 32c8s4, 64c4s2, 64c3s1, fc 512; [N, 512] out."""

    def __init__(self, compute_dtype: str = "float32", name: str | None = None):
        super().__init__(((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512, compute_dtype, name=name)


class ShallowTorso(ConvStackTorso):
    """Shallow torso of the IMPALA paper (Fig. 3 left): 16c8s4, 32c4s2, fc 256; [N, 256] out."""

    def __init__(self, compute_dtype: str = "float32", name: str | None = None):
        super().__init__(((16, 8, 4), (32, 4, 2)), 256, compute_dtype, name=name)


class ResidualBlock(snt.Module):
    """Pre-activation residual block: x + conv(relu(conv(relu(x)))), 3x3 SAME convs.

    Maps [N, H, W, C] to [N, H, W, C]; C must equal `num_channels`.
    """

    def __init__(self, num_channels: int, name: str | None = None):
        super().__init__(name=name)
        self._conv_0 = snt.Conv2D(num_channels, 3, stride=1, padding="SAME", name="conv_0")
        self._conv_1 = snt.Conv2D(num_channels, 3, stride=1, padding="SAME", name="conv_1")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        y = self._conv_0(tf.nn.relu(x))
        y = self._conv_1(tf.nn.relu(y))
        return x + y


class ResNetSection(snt.Module):
    """One section of the IMPALA ResNet: conv 3x3, max-pool 3x3 stride 2, residual blocks.

    Maps [N, H, W, C] to [N, ceil(H/2), ceil(W/2), num_channels].
    """

    def __init__(self, num_channels: int, num_blocks: int = 2, name: str | None = None):
        super().__init__(name=name)
        self._conv = snt.Conv2D(num_channels, 3, stride=1, padding="SAME", name="conv")
        self._blocks = [ResidualBlock(num_channels, name=f"block_{i}") for i in range(num_blocks)]

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        x = self._conv(x)
        x = tf.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME")
        for block in self._blocks:
            x = block(x)
        return x


class ResNetTorso(snt.Module):
    """Deep torso of the IMPALA paper (Fig. 3 right): sections of 16, 32, 32 channels.

    Maps raw pixels [N, H, W, C] to features [N, 256].
    """

    def __init__(self, channels: tuple[int, ...] = (16, 32, 32), name: str | None = None):
        super().__init__(name=name)
        self._sections = [ResNetSection(c, name=f"section_{i}") for i, c in enumerate(channels)]
        self._linear = snt.Linear(256)

    def __call__(self, observation: tf.Tensor) -> tf.Tensor:
        x = scale_pixels(observation)
        for section in self._sections:
            x = section(x)
        x = snt.Flatten()(tf.nn.relu(x))
        return tf.nn.relu(self._linear(x))


class MLPTorso(snt.Module):
    """Tanh MLP for low-dimensional vector observations (classic control).

    Maps observations [N, ...] (any numeric dtype, flattened) to features [N, hidden_sizes[-1]].
    """

    def __init__(self, hidden_sizes: tuple[int, ...] = (64, 64), name: str | None = None):
        super().__init__(name=name)
        self._layers = [snt.Linear(size, name=f"linear_{i}") for i, size in enumerate(hidden_sizes)]

    def __call__(self, observation: tf.Tensor) -> tf.Tensor:
        x = snt.Flatten()(tf.cast(observation, tf.float32))
        for layer in self._layers:
            # tanh keeps features bounded for unnormalised inputs (e.g. CartPole velocities).
            x = tf.tanh(layer(x))
        return x


class PolicyBaselineHead(snt.Module):
    """Linear policy logits and linear state-value baseline on top of features [N, H]."""

    def __init__(self, num_actions: int, name: str | None = None):
        super().__init__(name=name)
        # Small policy weights make the initial policy near-uniform, so early actors explore
        # and early importance weights stay close to 1.
        self._policy = snt.Linear(
            num_actions, w_init=snt.initializers.VarianceScaling(scale=0.01), name="policy"
        )
        self._baseline = snt.Linear(1, name="baseline")

    def __call__(self, features: tf.Tensor) -> AgentOutput:
        """Maps features [N, H] to logits [N, num_actions] and baseline [N]."""
        return AgentOutput(
            policy_logits=self._policy(features),
            baseline=tf.squeeze(self._baseline(features), axis=-1),
        )
